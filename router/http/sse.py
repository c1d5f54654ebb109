"""The router's server-sent-events response: one writer for the hot path (router/http/hot_path.py) and
any other ASGI server, with keep-alives while a request waits (router/http/keepalive.py)."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol

from starlette.responses import Response

from router.http.formats import DONE

SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
               (b"x-accel-buffering", b"no")]


class LastEvent(bytes):
    """The chunk that ends a stream which has no `data: [DONE]` (the Responses API's, router/http/responses.py):
    written as the body's last, as a chunk ending with [DONE] is."""


class SSEWriter(Protocol):
    """Where a stream's events go: the hot path's chunked writer (router/http/hot_path.py) or an ASGI
    server's `send` (`_AsgiWriter`). Each call returns an awaitable when the write must be waited for
    (flow control, an ASGI send), else None: the hot path writes without a coroutine per event."""

    def event(self, data: bytes, last: bool) -> Awaitable[None] | None:
        """One event; `last`: the body ends with it."""

    def end(self) -> Awaitable[None] | None:
        """The events ended without a last one: end the body."""

    def stop(self) -> None:
        """The stream is over, however it ended (before the events are closed): nothing more is written."""


class SSEResponse(Response):
    """A lean server-sent-events response: the events, and `finalize`, run however the stream ends.

    `write_to` is the one loop that writes a stream, for any writer: events up to the one ending with
    `data: [DONE]` or a `LastEvent` (`is_last`) or the events' end, that one as the body's last write,
    then `close()`. The router's HTTP protocol gives it its chunked writer (router/http/hot_path.py:
    head with the first event, the chunked terminator with the last, comment keep-alives after
    `keepalive_s` of silence and at once when `run`, the request's Run, pauses; client disconnect
    cancels the task, which lands in the events as CancelledError). Served by another ASGI server,
    `__call__` gives it `send`: start, one body message per event, end (no keep-alives).
    """

    def __init__(self, events, finalize, keepalive_s: float = 0.0, run=None):
        # NOTE: none of Response's own state: the protocol writes it
        self.events = events
        self.finalize = finalize
        self.keepalive_s = keepalive_s
        self.run = run
        self.status_code = 200
        self.background = None  # FastAPI returns a Response subclass as it is

    async def write_to(self, out: SSEWriter) -> None:
        try:
            async for event in self.events:
                last = event.endswith(DONE) or event.__class__ is LastEvent  # is_last, inline: per event
                pending = out.event(event, last)
                if pending is not None:
                    await pending
                if last:
                    return
            pending = out.end()
            if pending is not None:
                await pending
        finally:
            out.stop()
            await self.close()

    async def close(self) -> None:
        """The events closed and `finalize` run (the request's run gives back what it holds)."""
        try:
            await self.events.aclose()
        finally:
            await self.finalize()

    async def __call__(self, scope, receive, send) -> None:
        await self.write_to(_AsgiWriter(send))


class _AsgiWriter:
    """An ASGI server's `send` as an SSEWriter: the response's start goes with the first event."""

    __slots__ = ("_send", "_started")

    def __init__(self, send):
        self._send, self._started = send, False

    def event(self, data: bytes, last: bool) -> Awaitable[None]:
        return self._body(data, not last)

    def end(self) -> Awaitable[None]:
        return self._body(b"", False)

    def stop(self) -> None:
        pass

    async def _body(self, data: bytes, more: bool) -> None:
        if not self._started:
            self._started = True
            await self._send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        await self._send({"type": "http.response.body", "body": data, "more_body": more})


def is_last(event: bytes) -> bool:
    """The stream's last event: the body ends with it (one write less per request)."""
    return event.endswith(DONE) or event.__class__ is LastEvent
