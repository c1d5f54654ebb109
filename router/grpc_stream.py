"""A lean gRPC client for the router's hot call: server-streaming calls over one HTTP/2 connection.

Why not grpc.aio: it was most of the router's CPU (bench/router_overhead.py): every streamed message
crosses gRPC's poller thread (C queue -> socket -> event loop -> future), ~0.4 ms per 4-token call.
Here the event loop reads the worker's socket and parses frames in place; one read can carry several
tokens, which go to the client in one write. Info, Flush and health checks stay on grpc.aio.

    Channel(address) -- one TCP connection, reopened after it breaks or the server sends GOAWAY
      call(path, request, deserialize, timeout_s) -> StreamCall   (HEADERS + DATA, END_STREAM)
        StreamCall.next_batch()  every message received so far (at least one), [] at a clean end
        StreamCall.cancel()      RST_STREAM(CANCEL): the worker sees the call cancelled

It speaks standard gRPC over HTTP/2 (PROTOCOL-HTTP2.md): `grpc-timeout` carries the deadline
(also enforced here), errors arrive as `grpc-status`/`grpc-message` trailers and raise RpcError
with the same `code()` / `details()` as grpc.aio's. No compression, no server push.
"""

from __future__ import annotations

import asyncio
import socket
from urllib.parse import unquote

import grpc

from router.http2 import (
    ACK,
    CANCEL,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    PUSH_PROMISE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    HeaderDecoder,
    frame,
    literal,
    literal_indexed_name,
)

# NOTE: large receive windows, so a worker never waits on us; topped up when half is used.
_RECV_WINDOW = 1 << 24
_DEFAULT_WINDOW = 65535
_KEEPALIVE_S = 10.0  # with calls open and nothing read for this long, ping; no answer in as long -> broken

# HTTP/2 error code of RST_STREAM -> gRPC status (gRPC's PROTOCOL-HTTP2.md).
_RST_CODES = {0x7: grpc.StatusCode.UNAVAILABLE, 0x8: grpc.StatusCode.CANCELLED,
              0xB: grpc.StatusCode.RESOURCE_EXHAUSTED, 0xC: grpc.StatusCode.PERMISSION_DENIED}
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


def _grpc_timeout(seconds: float) -> bytes:
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
        "_status",
        "_timer",
        "_waiter",
        "send_window",
        "stream_id",
    )

    def __init__(self, conn: _Connection, stream_id: int, deserialize):
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
        while n - pos >= 5:
            length = int.from_bytes(buf[pos + 1:pos + 5], "big")
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
        self._finish(code, unquote(fields.get(b"grpc-message", b"").decode("utf-8", "replace")))

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


class _Connection(asyncio.Protocol):
    """One HTTP/2 connection to a worker, driven by the event loop (data_received parses frames)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, address: str):
        self.loop = loop
        self.address = address
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, StreamCall] = {}
        self.next_stream_id = 1
        self.usable = True  # False after GOAWAY, a lost connection or stream ids running out
        self.broken_reason = ""
        self.peer_initial_window = _DEFAULT_WINDOW
        self.peer_max_frame = 16384
        self.send_window = _DEFAULT_WINDOW
        self._recv_unacked = 0
        self._buf = b""
        self._header_block: tuple[int, int, bytearray] | None = None  # (stream, flags, fragments)
        self._headers = HeaderDecoder()
        self._last_read = loop.time()
        self._ping_sent_at: float | None = None
        self._keepalive: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        settings = (b"\x00\x02" + (0).to_bytes(4, "big")  # ENABLE_PUSH = 0
                    + b"\x00\x04" + _RECV_WINDOW.to_bytes(4, "big"))  # INITIAL_WINDOW_SIZE
        transport.write(PREFACE + frame(SETTINGS, 0, 0, settings)
                        + frame(WINDOW_UPDATE, 0, 0, (_RECV_WINDOW - _DEFAULT_WINDOW).to_bytes(4, "big")))
        self._keepalive = self.loop.call_later(_KEEPALIVE_S, self._check_alive)

    def connection_lost(self, exc) -> None:
        self._broken(f"connection to {self.address} lost" + (f": {exc}" if exc else ""))

    def data_received(self, data: bytes) -> None:
        self._last_read = self.loop.time()
        buf = self._buf + data if self._buf else data
        pos, n = 0, len(buf)
        try:
            while n - pos >= 9:
                length = int.from_bytes(buf[pos:pos + 3], "big")
                if n - pos - 9 < length:
                    break
                kind, flags = buf[pos + 3], buf[pos + 4]
                stream_id = int.from_bytes(buf[pos + 5:pos + 9], "big") & 0x7FFFFFFF
                self._on_frame(kind, flags, stream_id, buf[pos + 9:pos + 9 + length])
                pos += 9 + length
        except _ProtocolError as e:
            self._broken(f"HTTP/2 protocol error from {self.address}: {e}")
            self.transport.close()
            return
        self._buf = buf[pos:]

    # ------------------------------------------------------------------ frames
    def _on_frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._header_block is not None and kind != CONTINUATION:
            raise _ProtocolError("expected CONTINUATION")
        if kind == DATA:
            self._on_data(flags, stream_id, payload)
        elif kind == HEADERS:
            if flags & PADDED:
                payload = payload[1:len(payload) - payload[0]]
            if flags & PRIORITY:
                payload = payload[5:]
            self._header_block = (stream_id, flags, bytearray(payload))
            if flags & END_HEADERS:
                self._end_header_block()
        elif kind == CONTINUATION:
            if self._header_block is None or self._header_block[0] != stream_id:
                raise _ProtocolError("unexpected CONTINUATION")
            self._header_block[2].extend(payload)
            if flags & END_HEADERS:
                self._end_header_block()
        elif kind == RST_STREAM:
            call = self.streams.get(stream_id)
            if call is not None:
                code = int.from_bytes(payload[:4], "big")
                call._finish(_RST_CODES.get(code, grpc.StatusCode.INTERNAL), f"stream reset by the worker (HTTP/2 error {code})")
        elif kind == SETTINGS:
            if not flags & ACK:
                self._on_settings(payload)
        elif kind == PING:
            if flags & ACK:
                self._ping_sent_at = None
            else:
                self.transport.write(frame(PING, ACK, 0, payload))
        elif kind == GOAWAY:
            last = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
            self.usable = False
            self.broken_reason = f"the worker at {self.address} is going away"
            for sid, call in list(self.streams.items()):
                if sid > last:  # never processed by the worker: safe to retry elsewhere
                    call._finish(grpc.StatusCode.UNAVAILABLE, self.broken_reason)
        elif kind == WINDOW_UPDATE:
            increment = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
            if stream_id == 0:
                self.send_window += increment
                for call in list(self.streams.values()):
                    self._send_pending(call)
            else:
                call = self.streams.get(stream_id)
                if call is not None:
                    call.send_window += increment
                    self._send_pending(call)
        elif kind == PUSH_PROMISE:
            raise _ProtocolError("server push was disabled")
        # PRIORITY and unknown frame types are ignored (RFC 9113 5.5)

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        # NOTE: flow control counts the whole frame payload, padding included.
        size = len(payload)
        self._recv_unacked += size
        if self._recv_unacked >= _RECV_WINDOW // 2:
            self.transport.write(frame(WINDOW_UPDATE, 0, 0, self._recv_unacked.to_bytes(4, "big")))
            self._recv_unacked = 0
        if flags & PADDED:
            payload = payload[1:len(payload) - payload[0]]
        call = self.streams.get(stream_id)
        if call is None:
            return  # a stream we already reset or finished
        call._recv_unacked += size
        if call._recv_unacked >= _RECV_WINDOW // 2:
            self.transport.write(frame(WINDOW_UPDATE, 0, stream_id, call._recv_unacked.to_bytes(4, "big")))
            call._recv_unacked = 0
        if payload:
            call._on_data(payload)
        if flags & END_STREAM and call._status is None:
            call._finish(grpc.StatusCode.INTERNAL, "the worker ended the stream without trailers")

    def _end_header_block(self) -> None:
        stream_id, flags, block = self._header_block
        self._header_block = None
        try:
            # NOTE: every block must be decoded, even for streams we no longer track: HPACK's
            # dynamic table is shared by the whole connection.
            headers = self._headers.decode(bytes(block))
        except ValueError as e:
            raise _ProtocolError(str(e)) from None
        call = self.streams.get(stream_id)
        if call is not None:
            call._on_headers(headers, bool(flags & END_STREAM))

    def _on_settings(self, payload: bytes) -> None:
        for i in range(0, len(payload) - 5, 6):
            key, value = int.from_bytes(payload[i:i + 2], "big"), int.from_bytes(payload[i + 2:i + 6], "big")
            if key == 0x4:  # INITIAL_WINDOW_SIZE: applies to every open stream as a delta
                delta, self.peer_initial_window = value - self.peer_initial_window, value
                for call in self.streams.values():
                    call.send_window += delta
            elif key == 0x5:  # MAX_FRAME_SIZE
                self.peer_max_frame = value
        self.transport.write(frame(SETTINGS, ACK, 0))
        for call in list(self.streams.values()):
            self._send_pending(call)

    # ------------------------------------------------------------------ calls
    def start(self, header_block: bytes, message: bytes, deserialize, deadline: float) -> StreamCall:
        stream_id = self.next_stream_id
        self.next_stream_id += 2
        if self.next_stream_id > (1 << 30):
            self.usable = False  # NOTE: ids run out at 2^31; the channel opens a new connection
        call = StreamCall(self, stream_id, deserialize)
        self.streams[stream_id] = call
        call._timer = self.loop.call_at(deadline, call._on_deadline)
        call._pending = len(message).to_bytes(5, "big") + message  # flag byte 0 + 4-byte length
        # NOTE: HEADERS and the first DATA frames leave in one write: one syscall, and the worker
        # usually reads the whole request at once.
        self._send_pending(call, frame(HEADERS, END_HEADERS, stream_id, header_block))
        return call

    def _send_pending(self, call: StreamCall, head: bytes = b"") -> None:
        data = call._pending
        out = [head] if head else []
        sent = 0
        while sent < len(data):
            n = min(len(data) - sent, self.peer_max_frame, self.send_window, call.send_window)
            if n <= 0:
                break
            self.send_window -= n
            call.send_window -= n
            end = sent + n == len(data)
            out.append(frame(DATA, END_STREAM if end else 0, call.stream_id, data[sent:sent + n]))
            sent += n
        call._pending = data[sent:] if sent else data
        if out:
            self.transport.write(b"".join(out))

    def reset_stream(self, call: StreamCall, code: int) -> None:
        if call.stream_id in self.streams and self.transport is not None and not self.transport.is_closing():
            self.transport.write(frame(RST_STREAM, 0, call.stream_id, code.to_bytes(4, "big")))

    def forget(self, call: StreamCall) -> None:
        self.streams.pop(call.stream_id, None)
        if not self.usable and not self.streams and self.transport is not None:
            self.transport.close()  # a GOAWAY'd / retired connection closes after its last call

    # ------------------------------------------------------------------ failure
    def _check_alive(self) -> None:
        now = self.loop.time()
        if self._ping_sent_at is not None and now - self._ping_sent_at >= _KEEPALIVE_S:
            self._broken(f"the worker at {self.address} stopped answering pings")
            self.transport.close()
            return
        if self.streams and self._ping_sent_at is None and now - self._last_read >= _KEEPALIVE_S:
            self._ping_sent_at = now
            self.transport.write(frame(PING, 0, 0, bytes(8)))
        self._keepalive = self.loop.call_later(_KEEPALIVE_S / 2, self._check_alive)

    def _broken(self, reason: str) -> None:
        self.usable = False
        self.broken_reason = reason
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None
        for call in list(self.streams.values()):
            call._finish(grpc.StatusCode.UNAVAILABLE, reason)
        self.streams.clear()

    def close(self) -> None:
        self._broken(f"channel to {self.address} closed")
        if self.transport is not None:
            self.transport.close()


class _ProtocolError(Exception):
    pass


def _retrieve(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()


class Channel:
    """Calls to one worker (`host:port`) over one HTTP/2 connection, (re)connected on demand."""

    def __init__(self, address: str):
        self.address = address
        host, _, port = address.rpartition(":")
        self._host, self._port = host.strip("[]") or "127.0.0.1", int(port)
        self._conn: _Connection | None = None
        self._connecting: asyncio.Future | None = None
        self._authority = address.encode()
        self._header_prefix: dict[str, bytes] = {}  # path -> the header block without grpc-timeout
        self._closed = False

    async def call(self, path: str, message: bytes, deserialize, timeout_s: float) -> StreamCall:
        """Start a server-streaming call; connection failures raise RpcError(UNAVAILABLE)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        conn = self._conn
        if conn is None or not conn.usable:
            conn = await self._connect(loop, deadline)
        prefix = self._header_prefix.get(path)
        if prefix is None:
            prefix = self._header_prefix[path] = (
                b"\x83\x86"  # :method POST, :scheme http (static table 3 and 6)
                + literal_indexed_name(4, path.encode()) + literal_indexed_name(1, self._authority)
                + literal_indexed_name(31, b"application/grpc") + literal(b"te", b"trailers"))
        headers = prefix + literal(b"grpc-timeout", _grpc_timeout(deadline - loop.time()))
        return conn.start(headers, message, deserialize, deadline)

    async def _connect(self, loop: asyncio.AbstractEventLoop, deadline: float) -> _Connection:
        if self._closed:
            raise RpcError(grpc.StatusCode.UNAVAILABLE, f"channel to {self.address} is closed")
        if self._connecting is None:  # NOTE: concurrent first calls share one connection attempt
            self._connecting = loop.create_task(self._open(loop))
            self._connecting.add_done_callback(_retrieve)  # a timed-out attempt may fail unobserved
        connecting = self._connecting
        try:
            conn = await asyncio.wait_for(asyncio.shield(connecting), max(0.0, deadline - loop.time()))
        except TimeoutError:
            raise RpcError(grpc.StatusCode.DEADLINE_EXCEEDED, f"connecting to {self.address} timed out") from None
        except OSError as e:
            raise RpcError(grpc.StatusCode.UNAVAILABLE, f"failed to connect to {self.address}: {e}") from None
        finally:
            if connecting.done() and self._connecting is connecting:
                self._connecting = None
        return conn

    async def _open(self, loop: asyncio.AbstractEventLoop) -> _Connection:
        old = self._conn
        _, conn = await loop.create_connection(lambda: _Connection(loop, self.address), self._host, self._port)
        self._conn = conn
        if old is not None and not old.streams:
            old.close()  # NOTE: a GOAWAY'd connection with calls still open closes when they end
        return conn

    def close(self) -> None:
        self._closed = True
        if self._connecting is not None:
            self._connecting.cancel()
        if self._conn is not None:
            self._conn.close()
