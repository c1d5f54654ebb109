"""The router's server-sent-events response: one writer for the hot path (router/http/hot_path.py) and
any other ASGI server, with keep-alives while a request waits (router/http/keepalive.py)."""

from __future__ import annotations

from starlette.responses import Response

from router.http import formats

SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
               (b"x-accel-buffering", b"no")]


class LastEvent(bytes):
    """The chunk that ends a stream which has no `data: [DONE]` (the Responses API's, router/http/responses.py):
    written as the body's last, as a chunk ending with [DONE] is."""


class SSEResponse(Response):
    """A lean server-sent-events response: the events, and `finalize`, run however the stream ends.

    The router's HTTP protocol writes it itself (router/http/hot_path.py `HotCycle._stream`: head with
    the first event, the chunked terminator with the last, client disconnect cancels the task, which
    lands in the events as CancelledError), with comment keep-alives after `keepalive_s` of silence and
    at once when `run` (the request's Run, router/http/service.py) pauses (router/http/keepalive.py).
    Served by another ASGI server, `__call__` sends it: start, one body message per event, end (no
    keep-alives). Either writes events up to the one ending with `data: [DONE]` or a `LastEvent`
    (`is_last`) or the events' end, as the body's last write, then `close()`s.
    """

    def __init__(self, events, finalize, keepalive_s: float = 0.0, run=None):
        # NOTE: none of Response's own state: the protocol writes it
        self.events = events
        self.finalize = finalize
        self.keepalive_s = keepalive_s
        self.run = run
        self.status_code = 200
        self.background = None  # FastAPI returns a Response subclass as it is

    async def close(self) -> None:
        """The events closed and `finalize` run (the request's run gives back what it holds)."""
        try:
            await self.events.aclose()
        finally:
            await self.finalize()

    async def __call__(self, scope, receive, send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
            async for event in self.events:
                last = is_last(event)
                await send({"type": "http.response.body", "body": event, "more_body": not last})
                if last:
                    return
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await self.close()


def is_last(event: bytes) -> bool:
    """The stream's last event: the body ends with it (one write less per request)."""
    return event.endswith(formats.DONE) or event.__class__ is LastEvent
