"""Admin: the traces the fleet keeps in memory (observability.keep_traces), gathered from the router's own
ring and every known worker's (their Traces RPC, each call under observability.traces_rpc_timeout_s).
What `pdorch trace` reads.

    GET /admin/traces/{trace_id}         one trace: {"trace_id", "spans": [...], "unreachable": {address: error}}
    GET /admin/traces?request_id=ID      the same, found by request id
    GET /admin/traces?slowest=N          the N slowest traces the router keeps: {"traces": [one trace, ...]}

Spans are SpanRecords as JSON (pdorch/tracing/records.py), ordered by start. A worker that does not
answer in time is listed under `unreachable`: the trace is shown without its spans, never held up.
"""

from __future__ import annotations

import asyncio

from fastapi import FastAPI
from starlette.requests import Request

from pdorch.config import ObservabilityConfig
from pdorch.tracing.records import merge_records, record_dict
from pdorch.tracing.setup import Tracing
from proto.pdorch.v1 import worker_pb2
from router.errors import APIError, bad_request
from router.fleet.workers import WorkerPool
from router.http.auth import Auth
from router.http.formats import json_response

MAX_SLOWEST = 100


def add_routes(app: FastAPI, cfg: ObservabilityConfig, auth: Auth, pool: WorkerPool, tracing: Tracing) -> None:
    gather = TraceGatherer(cfg, pool, tracing)

    @app.get("/admin/traces/{trace_id}")
    async def one_trace(trace_id: str, request: Request):
        """Admin: one trace's spans from the router and every worker, ordered by start."""
        auth.check_admin(request.headers.get("authorization"))
        _check_kept(cfg)
        if len(trace_id) != 32 or not _is_hex(trace_id) or not int(trace_id, 16):
            raise bad_request(f"trace id must be 32 hex digits (not all zero), got {trace_id[:64]!r}",
                              param="trace_id")
        return json_response(await gather.trace(trace_id, ""))

    @app.get("/admin/traces", openapi_extra={"parameters": [
        {"name": "request_id", "in": "query", "required": False, "schema": {"type": "string"},
         "description": "the trace of this request"},
        {"name": "slowest", "in": "query", "required": False,
         "schema": {"type": "integer", "minimum": 1, "maximum": MAX_SLOWEST},
         "description": "the N slowest traces the router keeps"}]})
    async def traces(request: Request):
        """Admin: a request's trace (`?request_id=`), or the slowest N (`?slowest=N`)."""
        auth.check_admin(request.headers.get("authorization"))
        _check_kept(cfg)
        request_id, slowest = request.query_params.get("request_id"), request.query_params.get("slowest")
        if (request_id is None) == (slowest is None):
            raise bad_request("give exactly one of request_id or slowest", param="request_id")
        if request_id is not None:
            if not request_id:
                raise bad_request("request_id is empty", param="request_id")
            return json_response(await gather.trace("", request_id))
        assert slowest is not None  # exactly one of the two is given (checked above)
        if not slowest.isdigit() or not 1 <= int(slowest) <= MAX_SLOWEST:
            raise bad_request(f"slowest must be an integer in [1, {MAX_SLOWEST}], got {slowest[:32]!r}",
                              param="slowest")
        return json_response({"traces": await gather.slowest(int(slowest))})


class TraceGatherer:
    def __init__(self, cfg: ObservabilityConfig, pool: WorkerPool, tracing: Tracing):
        self.cfg, self.pool, self.tracing = cfg, pool, tracing

    async def trace(self, trace_id: str, request_id: str) -> dict:
        """One trace, by id or by request id; 404 when no process keeps any of it."""
        own = self.tracing.records(trace_id, request_id)
        if not trace_id and own:
            trace_id = own[0].trace_id  # ask the workers by trace: they may not tag every span with the id
        answers, unreachable = await self._ask_workers(trace_id, request_id)
        spans = merge_records([own, *answers])
        if not spans:
            what = f"trace {trace_id}" if trace_id else f"request {request_id!r}"
            raise APIError(404, f"no process keeps {what} (not sampled, or older than the last "
                           f"observability.keep_traces={self.cfg.keep_traces} traces)", "not_found_error",
                           param="request_id" if request_id else "trace_id")
        if not trace_id:
            trace_id = spans[0].trace_id
            spans = [s for s in spans if s.trace_id == trace_id]
        return {"trace_id": trace_id, "spans": [record_dict(s) for s in spans], "unreachable": unreachable}

    async def slowest(self, n: int) -> list[dict]:
        ring = self.tracing.ring
        ids = ring.slowest(n) if ring is not None else []
        return list(await asyncio.gather(*(self.trace(f"{tid:032x}", "") for tid in ids)))

    async def _ask_workers(self, trace_id: str, request_id: str) -> tuple[list, dict[str, str]]:
        workers = [w for w in self.pool.workers() if w.stub is not None]
        ask = worker_pb2.TracesRequest(trace_id=trace_id, request_id="" if trace_id else request_id)
        timeout = self.cfg.traces_rpc_timeout_s
        replies = await asyncio.gather(*(w.stub.Traces(ask, timeout=timeout) for w in workers),
                                       return_exceptions=True)
        answers, unreachable = [], {}
        for w, reply in zip(workers, replies, strict=True):
            if isinstance(reply, BaseException):
                code, details = getattr(reply, "code", None), getattr(reply, "details", None)  # a gRPC error's
                unreachable[w.address] = (f"{code().name}: {details()}" if callable(code) and callable(details)
                                          else repr(reply))
            else:
                answers.append(list(reply.spans))
        return answers, unreachable


def _check_kept(cfg: ObservabilityConfig) -> None:
    if not cfg.keep_traces:
        raise APIError(404, "no traces are kept: set observability.keep_traces (the last N traces in memory) "
                       "on the router and the workers", "not_found_error", param="observability.keep_traces")


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text.lower())
