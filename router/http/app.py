"""The router's HTTP API (FastAPI): OpenAI + SGLang-native routes, health, metrics, admin.

This module assembles the app: FastAPI declares every route (the OpenAPI document) and serves
all but the generation routes, which the router's HTTP protocol answers itself (`hot_routes`:
router/http/http_protocol.py, router/http/hot_path.py); FastAPI serves them too when the app runs elsewhere.
The handlers (router/http/generation.py, router/http/admin.py) parse the body (router/http/bodies.py), ask
RouterService for a Job, and format the stream (router/http/formats.py). Errors of every kind leave through `APIError` -> OpenAI-shaped
JSON; unexpected exceptions are logged and answered 500 without a stack trace.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response

from pdorch.config import Config
from pdorch.tracing import ROUTER_SERVICE, Tracing, setup_tracing
from router.dispatch.failover import failover_enabled
from router.dispatch.policies import make_policy
from router.errors import APIError
from router.fleet.discovery import make_discovery
from router.fleet.layout import KVLayout
from router.fleet.workers import WorkerPool
from router.http import admin, admin_traces, tokenize
from router.http.auth import Auth
from router.http.bodies import ChatCompletionRequest, CompletionRequest, GenerateRequest
from router.http.formats import error_response, json_response
from router.http.generation import GenerationHandlers
from router.http.hot_path import HotRoutes
from router.http.openapi import document_bodies
from router.http.responses import ResponsesHandlers
from router.http.responses_request import ResponsesRequest
from router.http.responses_store import ResponseStore, StoreLimits
from router.http.service import RouterService
from router.kv.choice import ChoiceWeights
from router.kv.index import KVIndex
from router.kv.watch import KVWatcher, kv_index_metrics
from router.metrics import RouterMetrics

log = logging.getLogger("pdorch.router")

_ROUTES = {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/models", "/generate", "/flush_cache", "/server_info",
           "/get_server_info", "/get_model_info", "/health", "/health_generate", "/metrics", "/workers",
           "/tokenize", "/detokenize"}


class RouterApp(FastAPI):
    """FastAPI, counting requests by route and status, and `hot_routes` for RouterHttpProtocol.

    A connection to `router.metrics_port` (the same server, one more listening socket) gets
    `/metrics` and nothing else: scrapers may reach that port where the API's is closed to them.
    """

    hot_routes: HotRoutes | None = None
    metrics_port: int = 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await super().__call__(scope, receive, send)
        if self.metrics_port and (scope.get("server") or (None, 0))[1] == self.metrics_port:
            return await self._metrics_only(scope, receive, send)
        path = scope["path"]
        route = path if path in _ROUTES else "other"
        requests = self.state.metrics.requests

        async def counting_send(message):
            if message["type"] == "http.response.start":
                requests.labels(route, message["status"]).inc()
            await send(message)

        await super().__call__(scope, receive, counting_send)

    async def _metrics_only(self, scope, receive, send) -> None:
        if scope["path"] == "/metrics" and scope["method"] in ("GET", "HEAD"):
            response = Response(self.state.metrics.render(), media_type=self.state.metrics.content_type)
        else:
            response = error_response(APIError(404, f"the metrics port serves GET /metrics only, not {scope['method']} "
                                               f"{scope['path'][:100]}", "not_found_error"))
        await response(scope, receive, send)


def create_app(cfg: Config, tokenizer, model_dir: Path | None = None) -> FastAPI:
    metrics = RouterMetrics()
    rc = cfg.router
    pool = WorkerPool(rc.circuit_breaker_failures, rc.circuit_breaker_cooldown_s, rc.health_check_interval_s,
                      cfg.grpc,  # the workers' shared gRPC token and TLS
                      KVLayout.from_config(cfg.model, model_dir))
    policy, watcher = _routing(cfg, pool, metrics)
    failover = failover_enabled(rc.mid_stream_failover, cfg.store.enabled, cfg.decode.offload_generated_kv)
    svc = RouterService(cfg.model, rc, failover, tokenizer, pool, policy, metrics, model_dir)
    tracing = setup_tracing(cfg.observability, ROUTER_SERVICE, f"router-{rc.host}:{rc.port}")
    _export_gauges(metrics, svc, pool, policy)
    auth = Auth(rc.api_key, rc.admin_key, rc.previous_api_key)
    discovery = make_discovery(cfg.discovery, pool)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await discovery.start()
        await pool.check_all()
        pool.start()
        if watcher is not None:
            await watcher.start()
        try:
            yield
        finally:
            if watcher is not None:
                await watcher.stop()
            await discovery.stop()
            await pool.close()
            tracing.shutdown()  # the last spans exported, within observability.shutdown_timeout_s

    app = RouterApp(title="pdorch router", version="1", lifespan=lifespan)
    app.metrics_port = rc.metrics_port
    app.state.service = svc
    app.state.pool = pool
    app.state.metrics = metrics
    app.state.kv_watcher = watcher  # pdorch status: each worker's stream state (router/http/admin.py)
    app.state.tracing = tracing
    _add_error_handlers(app)
    _add_generation_routes(app, cfg, svc, auth, metrics, tracing)
    admin.add_routes(app, cfg, svc, auth, pool, metrics)
    admin_traces.add_routes(app, cfg.observability, auth, pool, tracing)
    tokenize.add_routes(app, svc, auth)
    return app


def _routing(cfg: Config, pool: WorkerPool, metrics: RouterMetrics):
    """(the routing policy, the KV event watcher or None): what P and D are chosen by."""
    rc = cfg.router
    store_index = rc.cache_index_pages if cfg.store.enabled and rc.store_aware_routing else 0
    kv_index = watcher = None
    if rc.policy == "cache_aware" and rc.kv_events:  # route on what the workers say they hold
        kv_index = KVIndex(speculative_ttl_s=rc.kv_speculative_ttl_s)
        watcher = KVWatcher(pool, kv_index, cfg.model.page_size, name=f"router:{rc.port}",
                            stale_after_s=rc.kv_stale_after_s)
        metrics.extra.append(watcher.collect)
        metrics.extra.append(kv_index_metrics(kv_index))
    weights = ChoiceWeights(rc.kv_l1_weight, rc.kv_store_weight if cfg.store.enabled else 0.0,
                            rc.load_imbalance_threshold)
    policy = make_policy(rc.policy, rc.cache_index_pages, rc.load_imbalance_threshold, store_index,
                         kv_index, weights)
    if watcher is not None:
        watcher.on_load_changed = policy.load_changed
    return policy, watcher


def _export_gauges(metrics: RouterMetrics, svc: RouterService, pool: WorkerPool, policy) -> None:
    """Gauges read at scrape time."""
    metrics.in_flight = lambda: svc.in_flight
    metrics.workers_healthy = lambda: {role: len(pool.routable(role)) for role in ("prefill", "decode")}
    metrics.prefill_choices = lambda: getattr(policy, "decisions", {})
    metrics.decode_choices = lambda: getattr(policy, "decode_decisions", {})
    metrics.guess_fallbacks = lambda: getattr(policy, "guess_fallbacks", 0)


def _add_error_handlers(app: FastAPI) -> None:
    """Every error as OpenAI-style JSON, never a stack trace."""
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        kind = {404: "not_found_error", 405: "invalid_request_error"}.get(exc.status_code, "invalid_request_error")
        return error_response(APIError(exc.status_code, f"{exc.detail}: {request.method} {request.url.path}", kind))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log.exception("unexpected error on %s", request.url.path)
        return error_response(APIError(500, "internal error in the router (see its log)", "internal_error"))


def _add_generation_routes(app, cfg: Config, svc: RouterService, auth: Auth, metrics: RouterMetrics,
                           tracing: Tracing) -> None:
    """The generation routes (served by RouterHttpProtocol itself, router/http/hot_path.py; through FastAPI
    only under another server) and /v1/models."""
    gen = GenerationHandlers(cfg, svc, auth)
    rc = cfg.router
    responses = ResponsesHandlers(gen, ResponseStore(StoreLimits(rc.responses_store_max_entries,
                                                                 rc.responses_store_max_mb << 20,
                                                                 rc.responses_store_ttl_s)))
    app.state.responses_store = responses.store
    hot = HotRoutes({b"/v1/chat/completions": gen.chat, b"/v1/completions": gen.completions,
                     b"/v1/responses": responses.create, b"/generate": gen.generate}, metrics,
                    max_body_bytes=rc.max_body_mb << 20, tracing=tracing, model=cfg.model.served_name)
    app.hot_routes = hot

    def _route(handler):
        # NOTE: reached only where the app is served by another server than RouterHttpProtocol (or
        # through an unusual spelling of the path): the same handler, the same body limit.
        async def endpoint(request: Request):
            try:
                declared = request.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > hot.max_body_bytes:
                    raise hot.too_large()
                body = await request.body()
                if len(body) > hot.max_body_bytes:
                    raise hot.too_large()
                return await handler(request, body)
            except APIError as e:
                return error_response(e)
        return endpoint

    app.add_api_route("/v1/chat/completions", _route(gen.chat), methods=["POST"], name="chat_completions",
                      summary="OpenAI chat completion (streaming with `stream: true`)",
                      openapi_extra=document_bodies(ChatCompletionRequest))
    app.add_api_route("/v1/completions", _route(gen.completions), methods=["POST"], name="completions",
                      summary="OpenAI text completion (prompt as text or token ids)",
                      openapi_extra=document_bodies(CompletionRequest))
    app.add_api_route("/v1/responses", _route(responses.create), methods=["POST"], name="responses",
                      summary="OpenAI Responses API: input items, function tools, previous_response_id, events "
                      "with `stream: true`", openapi_extra=document_bodies(ResponsesRequest))
    responses.add_routes(app, auth)
    app.add_api_route("/generate", _route(gen.generate), methods=["POST"], name="generate",
                      summary="SGLang-native generation: `text` or `input_ids`, cumulative chunks",
                      openapi_extra=document_bodies(GenerateRequest))

    @app.api_route("/v1/models", methods=["GET", "HEAD"])
    async def models(request: Request):
        auth.check_client(request.headers.get("authorization"))
        return json_response({"object": "list", "data": [{
            "id": cfg.model.served_name, "object": "model", "created": 0, "owned_by": "pdorch",
            "root": cfg.model.source, "max_model_len": svc.context_limit()}]})

