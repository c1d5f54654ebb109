"""One server-streaming call of the router's lean gRPC client (router/grpc/stream.py).

    StreamCall.next_batch()  every message received so far (at least one), [] at a clean end
    StreamCall.cancel()      RST_STREAM(CANCEL): the worker sees the call cancelled

The connection (router/grpc/conn.py) feeds it DATA payloads and header blocks; errors arrive as
`grpc-status`/`grpc-message` trailers and raise RpcError with the same `code()` / `details()` as
grpc.aio's.
"""

from __future__ import annotations

import asyncio
from typing import Protocol
from urllib.parse import unquote

import grpc

from router.grpc.http2 import CANCEL


class Connection(Protocol):
    """What a call needs of its connection (router/grpc/conn.py's Connection; a Protocol, so this
    file does not import the connection that imports it)."""

    loop: asyncio.AbstractEventLoop
    max_message_bytes: int
    peer_initial_window: int
    goaway: tuple[int, int, bytes] | None

    def reset_stream(self, call: StreamCall, code: int) -> None: ...

    def goaway_text(self) -> str: ...

    def forget(self, call: StreamCall) -> None: ...


_STATUS_BY_NUMBER = {s.value[0]: s for s in grpc.StatusCode}


class RpcError(Exception):
    """A failed call; `code()` and `details()` read like grpc.aio.AioRpcError's."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"{code.name}: {details}")
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def grpc_timeout(seconds: float) -> bytes:
    # NOTE: grpc-timeout allows at most 8 digits; milliseconds cover 27 hours.
    return str(max(1, min(99_999_999, int(seconds * 1000)))).encode() + b"m"


class StreamCall:
    """One server-streaming call. Read with `next_batch()`; `cancel()` if you stop early."""

    __slots__ = (
        "_buffer",
        "_conn",
        "_deserialize",
        "_details",
        "_headers_seen",
        "_messages",
        "_pending",
        "_recv_unacked",
        "_refusals",
        "_request",
        "_status",
        "_timer",
        "_waiter",
        "send_window",
        "stream_id",
    )

    def __init__(self, conn: Connection, stream_id: int, deserialize):
        self._conn = conn
        self.stream_id = stream_id
        self._deserialize = deserialize
        self._messages: list = []
        self._buffer = b""
        self._waiter: asyncio.Future | None = None
        self._status: grpc.StatusCode | None = None  # set when the call is over
        self._details = ""
        self._headers_seen = False
        self._timer: asyncio.TimerHandle | None = None
        self._pending = b""  # request DATA not yet sent (flow control)
        self._request: tuple[bytes, bytes] | None = None  # (header block, DATA) until the worker answers
        self._refusals = 0  # REFUSED_STREAM answers so far (each resent after a backoff)
        self.send_window = conn.peer_initial_window
        self._recv_unacked = 0

    async def next_batch(self) -> list:
        """The messages received since the last call (at least one); [] when the call ended OK."""
        while not self._messages:
            if self._status is not None:
                if self._status == grpc.StatusCode.OK:
                    return []
                raise RpcError(self._status, self._details)
            self._waiter = self._conn.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        out, self._messages = self._messages, []
        return out

    def cancel(self) -> None:
        if self._status is None:
            self._conn.reset_stream(self, CANCEL)
            self._finish(grpc.StatusCode.CANCELLED, "cancelled by the router")

    # ------------------------------------------------------------------ called by the connection
    def _on_data(self, data: bytes) -> None:
        buf = self._buffer + data if self._buffer else data
        pos, n = 0, len(buf)
        limit = self._conn.max_message_bytes
        while n - pos >= 5:
            length = int.from_bytes(buf[pos + 1:pos + 5], "big")
            if length > limit:  # NOTE: refused on its 5-byte prefix, before any of it is buffered
                self._conn.reset_stream(self, CANCEL)
                self._finish(grpc.StatusCode.RESOURCE_EXHAUSTED, f"the worker sent a message larger than "
                             f"the router accepts ({length} vs. {limit} bytes)")
                return
            if n - pos - 5 < length:
                break
            if buf[pos]:
                self._conn.reset_stream(self, CANCEL)
                self._finish(grpc.StatusCode.INTERNAL, "compressed gRPC message (compression is not enabled)")
                return
            self._messages.append(self._deserialize(buf[pos + 5:pos + 5 + length]))
            pos += 5 + length
        self._buffer = buf[pos:]
        if self._messages:
            self._wake()

    def _on_headers(self, headers: list[tuple[bytes, bytes]], end_stream: bool) -> None:
        self._request = None  # answered: never resent
        if not self._headers_seen and not end_stream:
            self._headers_seen = True
            status = next((v for k, v in headers if k == b":status"), b"")
            if status != b"200":
                self._conn.reset_stream(self, CANCEL)
                self._finish(grpc.StatusCode.UNAVAILABLE if status in (b"502", b"503", b"504")
                             else grpc.StatusCode.UNKNOWN, f"worker answered HTTP {status.decode() or '?'}")
            return
        if not end_stream:
            return  # NOTE: headers after the first block without END_STREAM: ignored
        fields = dict(headers)
        raw = fields.get(b"grpc-status")
        if raw is None:
            self._finish(grpc.StatusCode.UNKNOWN if fields.get(b":status", b"200") == b"200"
                         else grpc.StatusCode.UNAVAILABLE, "the worker ended the call without a gRPC status")
            return
        code = _STATUS_BY_NUMBER.get(int(raw), grpc.StatusCode.UNKNOWN)
        details = unquote(fields.get(b"grpc-message", b"").decode("utf-8", "replace"))
        if code != grpc.StatusCode.OK and self._conn.goaway is not None:
            details += f" (after {self._conn.goaway_text()})"  # e.g. grpc-core's "Too many pings"
        self._finish(code, details)

    def _finish(self, code: grpc.StatusCode, details: str) -> None:
        if self._status is not None:
            return
        self._status, self._details = code, details
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._conn.forget(self)
        self._wake()

    def _on_deadline(self) -> None:
        self._timer = None
        if self._status is None:
            self._conn.reset_stream(self, CANCEL)
            self._finish(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded")

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)
