"""The router's server-sent-events response: one writer for the hot path (router/http/hot_path.py) and
any other ASGI server, with keep-alives while a request waits (router/http/keepalive.py)."""

from __future__ import annotations

from starlette.responses import Response

from router.http import formats
from router.http.keepalive import KeepAlive

SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
               (b"x-accel-buffering", b"no")]


class LastEvent(bytes):
    """The chunk that ends a stream which has no `data: [DONE]` (the Responses API's, router/http/responses.py):
    written as the body's last, as a chunk ending with [DONE] is."""


class SSEResponse(Response):
    """A lean server-sent-events response: the events, and `finalize`, run however the stream ends.

    The router's HTTP protocol writes it itself (router/http/hot_path.py: head with the first event,
    client disconnect cancels the task, which lands in the events as CancelledError), with comment
    keep-alives after `keepalive_s` of silence and at once when `run` (the request's _Run,
    router/http/service.py) pauses (router/http/keepalive.py). Served by another ASGI server,
    `__call__` sends it: start, one body message per event, end (no keep-alives).
    """

    def __init__(self, events, finalize, keepalive_s: float = 0.0, run=None):
        # NOTE: none of Response's own state: the protocol writes it
        self.events = events
        self.finalize = finalize
        self.keepalive_s = keepalive_s
        self.run = run
        self.status_code = 200
        self.background = None  # FastAPI returns a Response subclass as it is

    async def pump(self, write, start=None, send_now=None) -> bool:
        """The one SSE writer of both serving paths: `start()`, then `write(event, last)` for each
        event up to the one ending with `data: [DONE]` or a `LastEvent` (True) or the events' end (False); the
        events closed and `finalize` run however it ends. `send_now(bytes)`: writes without an await,
        for keep-alives (none without it). NOTE: the last event is the final body write (one write
        less per request: it matters at hundreds of requests/s)."""
        alive: KeepAlive | None = None
        try:
            if start is not None:
                await start()
            async for chunk in self.events:
                if alive is not None:
                    alive.waiting = False
                last = chunk.endswith(formats.DONE) or chunk.__class__ is LastEvent
                await write(chunk, last)
                if last:
                    return True
                if alive is None and send_now is not None and self.keepalive_s > 0:
                    alive = KeepAlive(self.keepalive_s, send_now)  # after the first event: the head is out
                    if self.run is not None:
                        self.run.on_pause = alive.now
                if alive is not None:
                    alive.idle()
            return False
        finally:
            if alive is not None:
                alive.stop()
            await self.events.aclose()
            await self.finalize()

    async def __call__(self, scope, receive, send) -> None:
        async def start():
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})

        async def write(chunk: bytes, last: bool):
            await send({"type": "http.response.body", "body": chunk, "more_body": not last})

        if not await self.pump(write, start):
            await send({"type": "http.response.body", "body": b"", "more_body": False})
