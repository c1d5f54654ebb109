"""The hot path: generation requests skip FastAPI's middleware/routing stack.

FastAPI still declares the generation routes (OpenAPI docs), but this pure ASGI middleware
answers POSTs to them first: read the body, call the handler, send its response. It also
owns client-disconnect handling for them with ONE watcher task per request:

    body read --> watcher awaits receive() --http.disconnect--> cancels the request task
                                                                 (gRPC call cancelled in finally)

NOTE: the watcher starts only after the body is read (two readers of `receive` would steal each
other's messages), and `done` is set before the last send: uvicorn's receive() also returns
http.disconnect once the response is complete, which is not a client disconnect.
Unexpected exceptions become a 500 JSON error without a stack trace (logged here).
"""

from __future__ import annotations

import asyncio
import logging

from starlette.requests import Request

from router.errors import APIError
from router.metrics import RouterMetrics

log = logging.getLogger("pdorch.router")

# A 128k-token prompt as JSON token ids is ~1 MiB; anything far beyond is a mistake or an attack.
# The default of `router.max_body_mb`.
MAX_BODY_BYTES = 8 << 20


class FastPath:
    def __init__(self, app, handlers: dict, metrics: RouterMetrics, known_routes: set[str],
                 max_body_bytes: int = MAX_BODY_BYTES):
        self.app = app
        self.handlers = handlers  # path -> async (request, body) -> response
        self.metrics = metrics
        self.known_routes = known_routes
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        route = path if path in self.known_routes else "other"
        handler = self.handlers.get(path) if scope["method"] == "POST" else None
        if handler is not None:
            return await self._serve(handler, scope, receive, send, route)

        async def counting_send(message):
            if message["type"] == "http.response.start":
                self.metrics.requests.labels(route, message["status"]).inc()
            await send(message)

        await self.app(scope, receive, counting_send)

    async def _too_large(self, scope, receive, send, route: str):
        self.metrics.requests.labels(route, "413").inc()
        limit = self.max_body_bytes
        size = f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit} bytes"
        await APIError(413, f"request body larger than {size} (router.max_body_mb)", "invalid_request_error",
                       code="request_too_large").response()(scope, receive, send)

    async def _serve(self, handler, scope, receive, send, route: str):
        status_seen = []
        for name, value in scope["headers"]:  # refuse a declared oversize body before reading any of it
            if name == b"content-length":
                if value.isdigit() and int(value) > self.max_body_bytes:
                    return await self._too_large(scope, receive, send, route)
                break
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return await self._too_large(scope, receive, send, route)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        task = asyncio.current_task()
        state = {"done": False, "gone": False}

        async def watch():
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    if not state["done"]:
                        state["gone"] = True
                        task.cancel()
                    return

        async def send_checked(message):
            if message["type"] == "http.response.body":
                if not message.get("more_body", False):
                    state["done"] = True
            else:
                status_seen.append(message["status"])
                self.metrics.requests.labels(route, message["status"]).inc()
            await send(message)

        watcher = task.get_loop().create_task(watch())
        try:
            try:
                response = await handler(Request(scope), body)
            except APIError as e:
                response = e.response()
            await response(scope, receive, send_checked)
        except asyncio.CancelledError:
            if state["gone"]:
                task.uncancel()  # the client left: nothing to answer, not an error
                return
            raise
        except Exception:
            log.exception("unexpected error on %s", scope["path"])
            if not status_seen:
                await APIError(500, "internal error in the router (see its log)", "internal_error").response()(
                    scope, receive, send)
        finally:
            state["done"] = True
            watcher.cancel()
