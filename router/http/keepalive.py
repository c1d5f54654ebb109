"""SSE keep-alives: a comment when a stream has been silent for `router.keepalive_s`.

A line that starts with ':' is a comment in server-sent events: clients skip it (the SSE spec; the
openai client's decoder, sglang's and vLLM's clients alike), but it is traffic on the connection, so
a proxy or load balancer with an idle timeout (nginx's proxy_read_timeout, 60 s; cloud load
balancers, 60 s) does not cut a stream that pauses: a request preempted on its decode worker
(decode_node/preemption.py: the worker's `paused` chunk sends one at once), a long queue, a slow step.

One timer per stream, re-armed when it fires: an event written costs a clock read, not a timer.
A comment goes out only while the stream waits for its next event (never between the parts of one).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

KEEPALIVE = b": keep-alive\n\n"


class KeepAlive:
    """One stream's keep-alives; `send(bytes)` writes at once (no await: the timer calls it)."""

    __slots__ = ("_every", "_handle", "_last", "_loop", "_send", "waiting")

    def __init__(self, every_s: float, send: Callable[[bytes], None]):
        self._loop = asyncio.get_running_loop()
        self._every, self._send = every_s, send
        self._last = self._loop.time()
        self.waiting = False  # the stream waits for its next event: a comment may go out
        self._handle: asyncio.TimerHandle | None = self._loop.call_at(self._last + every_s, self._fire)

    def idle(self) -> None:
        """An event went out; the stream waits for its next."""
        self._last = self._loop.time()
        self.waiting = True

    def now(self) -> None:
        """A comment at once (the request was just preempted: its stream pauses)."""
        if self.waiting and self._handle is not None:
            self._send(KEEPALIVE)
            self._last = self._loop.time()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        now = self._loop.time()
        if self.waiting and now - self._last >= self._every - 0.001:  # NOTE: asyncio may fire a hair early
            self._send(KEEPALIVE)
            self._last = now
        due = self._last + self._every
        self._handle = self._loop.call_at(due if due > now else now + self._every, self._fire)
