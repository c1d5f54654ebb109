"""The router's HTTP API (FastAPI): OpenAI + SGLang-native routes, health, metrics, admin.

Handlers parse the body (router/protocol.py), ask RouterService for a Job, and format the
stream (router/formats.py). Errors of every kind leave through `APIError` -> OpenAI-shaped
JSON; unexpected exceptions are logged and answered 500 without a stack trace.
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

from fastapi import FastAPI
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from pdorch.config import Config
from router import admin, formats
from router.auth import Auth
from router.discovery import make_discovery
from router.dispatch import StreamFailed
from router.errors import APIError, stream_error_event, upstream_error
from router.metrics import RouterMetrics
from router.openapi import document_bodies
from router.policies import make_policy
from router.protocol import (ChatCompletionRequest, CompletionRequest, GenerateRequest, parse,
                             sampling_from_openai, sampling_from_sglang)
from router.service import DEFAULT_GENERATE_MAX_TOKENS, ClientGone, RouterService, race_disconnect
from router.workers import WorkerPool

log = logging.getLogger("pdorch.router")

_ROUTES = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/generate", "/flush_cache", "/server_info",
           "/get_server_info", "/get_model_info", "/health", "/health_generate", "/metrics", "/workers"}
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _json(obj, status: int = 200) -> Response:
    return Response(formats.dumps(obj), status_code=status, media_type="application/json")


class _CountRequests:
    """Pure ASGI middleware: count responses by route and status (cheaper than BaseHTTPMiddleware)."""

    def __init__(self, app, metrics: RouterMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        route = path if path in _ROUTES else "other"

        async def counting_send(message):
            if message["type"] == "http.response.start":
                self.metrics.requests.labels(route, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counting_send)


def create_app(cfg: Config, tokenizer, model_dir: Path | None = None) -> FastAPI:
    metrics = RouterMetrics()
    rc = cfg.router
    pool = WorkerPool(rc.circuit_breaker_failures, rc.circuit_breaker_cooldown_s, rc.health_check_interval_s)
    policy = make_policy(rc.policy, rc.cache_index_pages, rc.load_imbalance_threshold)
    svc = RouterService(cfg, tokenizer, pool, policy, metrics, model_dir)
    auth = Auth(rc.api_key, rc.admin_key)
    discovery = make_discovery(cfg.discovery, pool)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await discovery.start()
        await pool.check_all()
        pool.start()
        try:
            yield
        finally:
            await discovery.stop()
            await pool.close()

    app = FastAPI(title="pdorch router", version="1", lifespan=lifespan)
    app.state.service = svc
    app.state.pool = pool
    app.state.metrics = metrics
    app.add_middleware(_CountRequests, metrics=metrics)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        kind = {404: "not_found_error", 405: "invalid_request_error"}.get(exc.status_code, "invalid_request_error")
        return APIError(exc.status_code, f"{exc.detail}: {request.method} {request.url.path}", kind).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log.exception("unexpected error on %s", request.url.path)
        return APIError(500, "internal error in the router (see its log)", "internal_error").response()

    # ------------------------------------------------------------------ OpenAI
    async def _openai(request: Request, chat: bool) -> Response:
        t0 = time.perf_counter()
        auth.check_client(request.headers.get("authorization"))
        body = await request.body()
        req = parse(ChatCompletionRequest if chat else CompletionRequest, body)
        svc.check_model(req.model)
        sampling, max_tokens = sampling_from_openai(req)
        if chat:
            ids = svc.encode_chat([{"role": m.role, "content": m.text()} for m in req.messages])
        else:
            ids = _completion_prompt(req.prompt, svc)
        param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        job = svc.make_job(ids, sampling, max_tokens, None, request, max_tokens_param=param)
        route = "/v1/chat/completions" if chat else "/v1/completions"
        oid = ("chatcmpl-" if chat else "cmpl-") + job.request_id
        created = int(time.time())
        model = cfg.model.name
        progress, first, run = await _start(job, request, route, t0)
        if not req.stream:
            return await _collect(request, run, lambda: (formats.chat_final if chat else formats.completion_final)(
                progress, oid, created, model))
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        chunk = formats.chat_chunk if chat else formats.completion_chunk

        async def events():
            try:
                yield chunk(progress, oid, created, model, first, True, include_usage)
                async for delta in run:
                    yield chunk(progress, oid, created, model, delta, False, include_usage)
                if include_usage:
                    yield formats.usage_chunk(progress, oid, created, model, chat)
            except StreamFailed as e:
                yield formats.sse(stream_error_event(str(e)))
            finally:
                await run.aclose()
            yield formats.DONE

        return StreamingResponse(events(), media_type="text/event-stream", headers=_SSE_HEADERS,
                                 background=BackgroundTask(run.aclose))

    async def _start(job, request, route, t0):
        try:
            return await svc.start(job, request, route, t0)
        except ClientGone:
            raise APIError(499, "client closed the request", "client_closed") from None

    async def _collect(request: Request, run, final) -> Response:
        async def drain():
            async for _ in run:
                pass

        try:
            await _race(request, drain())
        except StreamFailed as e:
            raise upstream_error(str(e)) from None
        finally:
            await run.aclose()
        return _json(final())

    async def _race(request, coro):
        try:
            return await race_disconnect(request, coro)
        except ClientGone:
            return None

    @app.post("/v1/chat/completions", openapi_extra=document_bodies(ChatCompletionRequest))
    async def chat_completions(request: Request):
        """OpenAI chat completion (streaming with `stream: true`)."""
        return await _openai(request, chat=True)

    @app.post("/v1/completions", openapi_extra=document_bodies(CompletionRequest))
    async def completions(request: Request):
        """OpenAI text completion (prompt as text or token ids)."""
        return await _openai(request, chat=False)

    @app.get("/v1/models")
    async def models(request: Request):
        auth.check_client(request.headers.get("authorization"))
        return _json({"object": "list", "data": [{
            "id": cfg.model.name, "object": "model", "created": 0, "owned_by": "pdorch",
            "root": cfg.model.source, "max_model_len": svc.context_limit()}]})

    # ------------------------------------------------------------------ SGLang-native
    @app.post("/generate", openapi_extra=document_bodies(GenerateRequest))
    async def generate(request: Request):
        """SGLang-native generation: `text` or `input_ids`, cumulative `text`/`output_ids` chunks."""
        t0 = time.perf_counter()
        auth.check_client(request.headers.get("authorization"))
        req = parse(GenerateRequest, await request.body())
        if (req.text is None) == (req.input_ids is None):
            raise APIError(400, "give exactly one of `text` or `input_ids`", param="text")
        if req.return_logprob:
            raise APIError(400, "return_logprob is not supported", param="return_logprob")
        sampling, max_tokens = sampling_from_sglang(req.sampling_params)
        ids = svc.encode(req.text) if req.text is not None else list(req.input_ids)
        job = svc.make_job(ids, sampling, max_tokens, DEFAULT_GENERATE_MAX_TOKENS, request, req.rid,
                           max_tokens_param="sampling_params.max_new_tokens")
        progress, first, run = await _start(job, request, "/generate", t0)
        if not req.stream:
            return await _collect(request, run, lambda: formats.generate_body(progress, time.perf_counter() - t0))

        async def events():
            try:
                yield formats.sse(formats.generate_body(progress, time.perf_counter() - t0))
                async for _ in run:
                    yield formats.sse(formats.generate_body(progress, time.perf_counter() - t0))
            except StreamFailed as e:
                yield formats.sse(stream_error_event(str(e)))
            finally:
                await run.aclose()
            yield formats.DONE

        return StreamingResponse(events(), media_type="text/event-stream", headers=_SSE_HEADERS,
                                 background=BackgroundTask(run.aclose))

    admin.add_routes(app, cfg, svc, auth, pool, metrics)
    return app


def _completion_prompt(prompt, svc: RouterService) -> list[int]:
    if isinstance(prompt, str):
        return svc.encode(prompt)
    if not prompt:
        raise APIError(400, "prompt is empty", param="prompt")
    if isinstance(prompt[0], int):
        return list(prompt)
    if len(prompt) != 1:
        raise APIError(400, f"batched prompts are not supported (got {len(prompt)}); send one prompt per request",
                       param="prompt")
    one = prompt[0]
    return svc.encode(one) if isinstance(one, str) else list(one)

