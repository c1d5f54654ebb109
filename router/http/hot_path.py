"""The hot path: a generation request served straight from the HTTP protocol, without ASGI.

uvicorn turns every request into an ASGI cycle: a scope dict, a cycle object with an asyncio.Event,
`receive`/`send` coroutines trading message dicts, and (to notice a client leaving) a second task
reading `receive`. That was a third of the router's Python work per request. For POSTs to the
generation routes (`HotRoutes.handlers`) `RouterHttpProtocol` (router/http/http_protocol.py) makes a
`HotCycle` instead:

    headers parsed --> HotCycle; uvicorn's protocol starts its task (pipelined requests wait their turn)
    body complete  --> handler(request, body) --> a JSON response, or SSE events written as they come
    connection lost before the response is complete --> the task is cancelled (the gRPC call with it)

A HotCycle has the attributes uvicorn's protocol reads and writes on its cycle (`body`, `more_body`,
`message_event.set()`, `response_complete`, `disconnected`, `keep_alive`) and runs as `run_asgi(app)`,
so the protocol's connection handling (keep-alive, pipelining, flow control, graceful shutdown)
stays uvicorn's. Every other request goes through uvicorn's own cycle to FastAPI. A stream's
response head leaves in the same write as its first event (one syscall, one client wake-up less
on the TTFT path). Unexpected exceptions become a 500 JSON error without a stack trace (logged).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from starlette.datastructures import Headers
from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from pdorch.tracing.log_filter import REQUEST_TRACE_ID
from pdorch.tracing.setup import NO_TRACING, Tracing
from router.dispatch.request_trace import RequestTrace
from router.errors import APIError
from router.http.formats import error_response
from router.http.keepalive import KeepAlive
from router.http.sse import SSE_HEADERS, SSEResponse
from router.metrics import RouterMetrics

log = logging.getLogger("pdorch.router")

# A 128k-token prompt as JSON token ids is ~1 MiB; anything far beyond is a mistake or an attack.
# The default of `router.max_body_mb`.
MAX_BODY_BYTES = 8 << 20


@dataclass(frozen=True)
class HotRoutes:
    """What the protocol serves itself: raw path -> async handler(request, body) -> response."""

    handlers: dict[bytes, Callable]
    metrics: RouterMetrics
    max_body_bytes: int = MAX_BODY_BYTES
    tracing: Tracing = NO_TRACING  # on: each request is a router.request span (router/dispatch/request_trace.py)
    model: str = ""  # the served model's name (the span's pdorch.model)

    def too_large(self) -> APIError:
        limit = self.max_body_bytes
        size = f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit} bytes"
        return APIError(413, f"request body larger than {size} (router.max_body_mb)", "invalid_request_error",
                        code="request_too_large")


class HotRequest:
    """What the generation handlers read of a request (as on Starlette's Request): path and headers,
    and its spans (None with tracing off) for the job to carry (RouterService.make_job)."""

    __slots__ = ("_headers", "_raw_headers", "scope", "trace")

    def __init__(self, path: str, raw_headers: list[tuple[bytes, bytes]], trace: RequestTrace | None = None):
        self.scope = {"path": path}
        self._raw_headers = raw_headers
        self._headers: Headers | None = None
        self.trace = trace

    @property
    def headers(self) -> Headers:
        """Built when first read: most requests read none (no API key, no session header configured)."""
        if self._headers is None:
            self._headers = Headers(raw=self._raw_headers)
        return self._headers


class HotCycle:
    def __init__(self, protocol, routes: HotRoutes, handler: Callable, path: str, headers: list,
                 keep_alive: bool, expect_100_continue: bool, declared_length: int):
        self.transport = protocol.transport
        self.flow = protocol.flow
        self.on_response = protocol.on_response_complete
        self.default_headers = protocol.server_state.default_headers
        self.routes = routes
        self.handler = handler
        self.path = path
        self.headers = headers
        self.keep_alive = keep_alive
        self.declared_length = declared_length
        self.body = bytearray()
        self.more_body = True
        self._waiter: asyncio.Future | None = None
        self.response_started = False
        self.response_complete = False
        self.disconnected = False
        self._expect_100_continue = expect_100_continue
        self._task: asyncio.Task | None = None
        self._gone = False
        self._trace: RequestTrace | None = None
        self._status = 0  # the response's, once its head is out
        self._error: APIError | None = None

    @property
    def message_event(self) -> HotCycle:
        """What uvicorn's protocol sets (`message_event.set()`) when body arrives, the message is
        complete, or the connection is lost: the cycle itself. NOTE: not an object that points back at
        the cycle: that was a reference cycle per request, left for the garbage collector."""
        return self

    def set(self) -> None:
        """The protocol has news: wake the body's reader; a connection lost before the response is
        complete cancels the request."""
        if self.disconnected and not self.response_complete:
            self.client_left()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def client_left(self) -> None:
        if self._task is not None and not self._gone:
            self._gone = True
            self._task.cancel()

    async def run_asgi(self, app) -> None:
        """The request's task (named as uvicorn's protocol calls it; `app` is not used)."""
        if self.disconnected:  # a pipelined request whose client left before its turn
            return
        self._task = task = asyncio.current_task()
        assert task is not None  # run as the protocol's task
        token = None
        if self.routes.tracing.enabled:
            traceparent, tracestate = _trace_headers(self.headers)
            self._trace = RequestTrace(self.routes.tracing, traceparent, tracestate, self.path, self.routes.model)
            # every log line about the request names its trace (pdorch/tracing/log_filter.py)
            token = REQUEST_TRACE_ID.set(self._trace.trace_id)
        try:
            await self._serve()
        except asyncio.CancelledError:
            if self._gone:
                task.uncancel()  # the client left: nothing to answer, not an error
                return
            raise
        except Exception:
            log.exception("unexpected error on %s", self.path)
            if self.response_started:
                self.transport.close()
            else:
                self._respond(error_response(APIError(500, "internal error in the router (see its log)",
                                                             "internal_error")))
        finally:
            if self._trace is not None:
                self._end_trace(self._trace)
            if token is not None:
                REQUEST_TRACE_ID.reset(token)

    async def _serve(self) -> None:
        limit = self.routes.max_body_bytes
        # NOTE: a declared oversize body is refused before any of it is read, an undeclared one
        # (chunked) as soon as what has arrived passes the limit
        while self.more_body and self.declared_length <= limit and len(self.body) <= limit:
            await self._more_body()
        if self.declared_length > limit or len(self.body) > limit:
            return self._respond(error_response(self.routes.too_large()))
        try:
            response = await self.handler(HotRequest(self.path, self.headers, self._trace), bytes(self.body))
        except APIError as e:
            self._error = e
            response = error_response(e)
        if isinstance(response, SSEResponse):
            # chunked server-sent events, by the response's one loop (NOTE: awaited here, not in a
            # method of its own: every token passes through each coroutine frame between the task and it)
            await response.write_to(ChunkedSSE(self, response))
            self._complete()
        else:
            self._respond(response)

    async def _more_body(self) -> None:
        if self._expect_100_continue:
            self._expect_100_continue = False
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self.flow.resume_reading()  # the protocol pauses reading past its high-water mark
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def _end_trace(self, trace: RequestTrace) -> None:
        if self._gone:  # NOTE: 499, as proxies log it: the client closed the connection first
            trace.end(499, "client_closed", "the client closed the connection")
        elif self._error is not None:
            trace.end(self._status, str(self._error.code), self._error.message)
        else:
            trace.end(self._status or 500)

    def _head(self, status: int, headers) -> list[bytes]:
        self.response_started = True
        self._status = status
        self.routes.metrics.answered(self.path, status)
        parts = [STATUS_LINE[status]]
        for name, value in self.default_headers:
            parts += (name, b": ", value, b"\r\n")
        for name, value in headers:
            parts += (name, b": ", value, b"\r\n")
        if self._trace is not None:
            parts += (b"traceparent: ", self._trace.traceparent(), b"\r\n")
        if not self.keep_alive:
            parts.append(b"connection: close\r\n")
        parts.append(b"\r\n")
        return parts

    def _respond(self, response) -> None:
        """A whole response (Starlette's Response: status, raw headers with content-length, body)."""
        parts = self._head(response.status_code, response.raw_headers)
        parts.append(response.body)
        self.transport.write(b"".join(parts))
        self._complete()

    def _complete(self) -> None:
        self.response_complete = True
        if not self.keep_alive:
            self.transport.close()
        self.on_response()  # the protocol starts a pipelined request or arms the keep-alive timeout


_SSE_HEADERS = (*SSE_HEADERS, (b"transfer-encoding", b"chunked"))
_LAST_CHUNK = b"0\r\n\r\n"


class ChunkedSSE:
    """A stream's events as HTTP/1.1 chunks on the cycle's transport (an SSEWriter, router/http/sse.py):
    the response head in the same write as the first event, the chunked terminator in the same write
    as the last. Keep-alive comments while the stream waits (router/http/keepalive.py), from its first
    event on, until `stop`."""

    __slots__ = ("_alive", "_flow", "_head", "_keepalive_s", "_run", "_transport")

    def __init__(self, cycle: HotCycle, response: SSEResponse):
        self._head = b"".join(cycle._head(200, _SSE_HEADERS))
        self._transport, self._flow = cycle.transport, cycle.flow
        self._keepalive_s, self._run = response.keepalive_s, response.run
        self._alive: KeepAlive | None = None

    def event(self, data: bytes, last: bool) -> Awaitable[None] | None:
        alive = self._alive
        if alive is not None:
            alive.waiting = False
        chunk = b"%s%x\r\n%s\r\n%s" % (self._head, len(data), data, _LAST_CHUNK if last else b"")
        self._head = b""
        if self._flow.write_paused:
            return self._write_when_drained(chunk, last)
        # NOTE: _write's body, inline: this runs per event (a cold call costs microseconds, docs/benchmarks.md)
        self._transport.write(chunk)
        if not last:
            (alive or self._keep_alive()).idle()
        return None

    def end(self) -> None:
        self._transport.write(self._head + _LAST_CHUNK)
        self._head = b""

    def stop(self) -> None:
        alive = self._alive
        if alive is not None:
            alive.stop()
            # NOTE: keep-alive, writer and run point at each other (its send, the run's on_pause): let go
            # here, or the three stay in a reference cycle for the garbage collector after every stream.
            self._alive = None
            if self._run is not None:
                self._run.on_pause = None

    async def _write_when_drained(self, chunk: bytes, last: bool) -> None:
        await self._flow.drain()
        self._write(chunk, last)

    def _write(self, chunk: bytes, last: bool) -> None:
        """The chunk out; after any but the last the stream waits: keep-alives may follow."""
        self._transport.write(chunk)
        if not last:
            (self._alive or self._keep_alive()).idle()

    def _keep_alive(self) -> KeepAlive | _NoKeepAlive:
        """After the first event (the head is out): comments may follow, every keepalive_s (0: none)."""
        if self._keepalive_s <= 0:
            return _NO_KEEPALIVE
        alive = self._alive = KeepAlive(self._keepalive_s, self._send_now)
        if self._run is not None:
            self._run.on_pause = alive.now
        return alive

    def _send_now(self, data: bytes) -> None:
        """A keep-alive comment; the head is out."""
        if not self._transport.is_closing():
            self._transport.write(b"%x\r\n%s\r\n" % (len(data), data))


class _NoKeepAlive:
    """keepalive_s 0: the stream sends no comments."""

    @staticmethod
    def idle() -> None:
        pass


_NO_KEEPALIVE = _NoKeepAlive()


def _trace_headers(raw: list[tuple[bytes, bytes]]) -> tuple[str | None, str | None]:
    """The client's `traceparent` and `tracestate` (names arrive lowercased from the parser); one pass
    over the raw headers, no Headers object: this runs for every request while tracing is on."""
    traceparent = tracestate = None
    for name, value in raw:
        if name == b"traceparent":
            traceparent = value.decode("latin-1")
        elif name == b"tracestate":
            tracestate = value.decode("latin-1")
    return traceparent, tracestate
