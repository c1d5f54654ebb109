"""Operational routes: health, health_generate, metrics, server info, flush_cache, workers."""

from __future__ import annotations

import asyncio
import json
import sys
import time

import grpc
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from pdorch.config import Config
from proto.pdorch.v1 import worker_pb2
from router.errors import APIError, bad_request, unavailable, upstream_error
from router.fleet.workers import WorkerPool
from router.http import formats
from router.http.auth import Auth
from router.http.body_sampling import BodySampling
from router.http.formats import json_response
from router.http.service import JobSpec, RouterService
from router.metrics import RouterMetrics

STORE_FLUSH_TIMEOUT_S = 60.0


def add_routes(app: FastAPI, cfg: Config, svc: RouterService, auth: Auth, pool: WorkerPool,
               metrics: RouterMetrics) -> None:
    """Health and metrics, the server's info, and the admin routes (workers, flush)."""
    _add_health_routes(app, svc, pool, metrics)
    _add_info_routes(app, cfg, svc, auth, pool)
    _add_admin_routes(app, cfg, svc, auth, pool)


def _counts(pool: WorkerPool) -> dict:
    return {role: {"known": len(pool.workers(role)), "routable": len(pool.routable(role))}
            for role in ("prefill", "decode")}


def _add_health_routes(app: FastAPI, svc: RouterService, pool: WorkerPool, metrics: RouterMetrics) -> None:
    # NOTE: GET routes that probes and scrapers may also ask with HEAD answer it (FastAPI's @app.get does not).
    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health():
        """200 when at least one prefill and one decode worker are routable, else 503."""
        c = _counts(pool)
        ok = c["prefill"]["routable"] > 0 and c["decode"]["routable"] > 0
        if not ok:
            err = unavailable("no healthy prefill/decode pair: " + formats.dumps(c).decode())
            return Response(formats.dumps({**err.body(), "workers": c}), status_code=503,
                            headers=err.headers, media_type="application/json")
        return json_response({"status": "ok", "workers": c})

    @app.get("/health_generate")
    async def health_generate(request: Request):
        """A real one-token generation through a P/D pair."""
        t0 = time.perf_counter()
        ids = svc.encode("Hello") or [0]
        sampling = worker_pb2.SamplingParams(temperature=0.0, top_p=1.0, top_k=-1)
        spec = JobSpec(ids, BodySampling(sampling, 1, "max_tokens"), default_max_tokens=1)
        try:
            run = await svc.start(request, "/health_generate", t0, spec)
            progress = run.progress
            try:
                async for _ in run:
                    pass
            finally:
                await run.aclose()
        except APIError as e:
            raise unavailable(f"health generation failed: {e.message}") from None
        except Exception as e:  # noqa: BLE001 - StreamFailed or a broken worker: the probe fails
            raise unavailable(f"health generation failed: {e}") from None
        return json_response({"status": "ok", "output_ids": progress.output_ids,
                      "latency_s": round(time.perf_counter() - t0, 6)})

    @app.api_route("/metrics", methods=["GET", "HEAD"])
    async def prom_metrics():
        return Response(metrics.render(), media_type=metrics.content_type)


def _add_info_routes(app: FastAPI, cfg: Config, svc: RouterService, auth: Auth, pool: WorkerPool) -> None:
    def server_info() -> dict:
        return {"model": cfg.model.served_name, "model_path": str(svc.model_dir or cfg.model.source),
                "served_model_name": cfg.model.served_name, "page_size": cfg.model.page_size,
                "max_context_tokens": svc.context_limit(), "policy": cfg.router.policy,
                "disaggregation_mode": "prefill_decode", "workers": _counts(pool), "version": "pdorch-1"}

    @app.get("/server_info")
    async def get_server_info(request: Request):
        auth.check_client(request.headers.get("authorization"))
        return json_response(server_info())

    app.add_api_route("/get_server_info", get_server_info, methods=["GET"], include_in_schema=False)

    @app.get("/get_model_info")
    async def get_model_info(request: Request):
        auth.check_client(request.headers.get("authorization"))
        return json_response({"model_path": str(svc.model_dir or cfg.model.source), "served_model_name": cfg.model.served_name,
                      "is_generation": True})


def _add_admin_routes(app: FastAPI, cfg: Config, svc: RouterService, auth: Auth, pool: WorkerPool) -> None:
    @app.get("/workers")
    async def workers(request: Request):
        """Admin: every known worker with health, circuit state, load and last Info; the chat template in use."""
        auth.check_admin(request.headers.get("authorization"))
        watcher = getattr(app.state, "kv_watcher", None)
        out = []
        for w in pool.workers():
            d = w.describe()
            if watcher is not None:  # its KV event stream (router/kv/watch.py)
                d["kv_events"] = ev = watcher.describe(w.address)
                if ev is not None:  # the router weighs published_load + this, at least in_flight
                    ev["routed_since_batch"] = w.routed - w.kv_routed_mark
            out.append(d)
        return json_response({"workers": out, "chat_template": svc.chat_status})

    @app.post("/flush_cache", openapi_extra={"parameters": [{
        "name": "store", "in": "query", "required": False, "schema": {"type": "boolean", "default": False},
        "description": "also remove every object from the Mooncake store"}]})
    async def flush_cache(request: Request):
        """Admin: drop every worker's L1 prefix cache; `?store=true` also clears the Mooncake store."""
        auth.check_admin(request.headers.get("authorization"))  # NOTE: before looking at anything else
        store = _query_bool(request, "store")
        ws = pool.workers()
        if not ws:
            raise unavailable("no workers are known; nothing to flush")
        results = await asyncio.gather(*(_flush(w) for w in ws))
        failed = [r for r in results if "error" in r]
        body: dict = {"workers": results}
        if store:
            body["store"] = await clear_store(cfg)
        if failed:
            raise upstream_error(f"flush failed on {len(failed)} of {len(ws)} workers: "
                                 + "; ".join(f"{r['address']}: {r['error']}" for r in failed))
        svc.policy.reset(store)
        return json_response({"status": "ok", **body})

    app.add_api_route("/flush_cache", flush_cache, methods=["GET"], include_in_schema=False)


def _query_bool(request: Request, name: str) -> bool:
    """A boolean query parameter (absent: false); anything else than a boolean word is a 400."""
    value = request.query_params.get(name)
    if value is None:
        return False
    word = value.strip().lower()
    if word in ("true", "1", "yes", "on"):
        return True
    if word in ("false", "0", "no", "off", ""):
        return False
    raise bad_request(f"query parameter {name} must be true or false, got {value[:40]!r}", param=name)


async def _flush(w) -> dict:
    try:
        resp = await w.stub.Flush(worker_pb2.FlushRequest(), timeout=10)
        return {"role": w.role, "address": w.address, "pages_freed": resp.pages_freed}
    except grpc.aio.AioRpcError as e:
        return {"role": w.role, "address": w.address, "error": f"{e.code().name}: {e.details()}"}


async def clear_store(cfg: Config) -> dict:
    """Remove every object from the Mooncake store, in a child process.

    NOTE: Mooncake's `setup` holds the GIL and retries for ~90 s while the master is unreachable;
    a child process keeps that off the router's event loop and can be killed on timeout.
    """
    if not cfg.store.enabled:
        raise APIError(501, "store.enabled is false: there is no store to clear", "not_implemented")
    s = cfg.store
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "store_client.clear_all", s.master_address, s.metadata_server, s.protocol,
        s.device_name, s.local_hostname, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(STORE_FLUSH_TIMEOUT_S):  # NOTE: not wait_for, which drops a cancel on 3.11
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise unavailable(f"clearing the store timed out after {STORE_FLUSH_TIMEOUT_S:.0f}s "
                          f"(is mooncake_master at {s.master_address} up?)") from None
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise upstream_error(f"clearing the store failed: {tail[0]}")
    return json.loads(out.decode().strip().splitlines()[-1])
