"""One HTTP/2 connection of the router's lean gRPC client, driven by the event loop.

`data_received` parses frames in place and hands DATA and header blocks to the calls
(router/grpc/call.py). What the connection owes the worker's gRPC server (grpc-core):

- Keepalive: ping only while calls are open and nothing was read for `keepalive_s`, at most one
  ping in flight, the next one at least `keepalive_s` after its answer. grpc-core counts a ping
  that comes sooner than its `min_recv_ping_interval_without_data` as a strike and, past
  `max_ping_strikes`, answers GOAWAY ENHANCE_YOUR_CALM "too_many_pings" and closes the connection;
  the workers permit pings every 4 s (pdorch/worker/main.py), the router pings after 10 s. An idle
  connection (no calls) never pings: grpc-core allows that only every 2 hours by default.
- SETTINGS_MAX_CONCURRENT_STREAMS: a call waits for a free stream (FIFO, within its deadline)
  instead of being refused by the worker. Calls start only after the worker's first SETTINGS.
- GOAWAY: calls above its last-stream-id were never processed and fail with UNAVAILABLE (the
  dispatcher retries them elsewhere); calls at or below it go on until they end; new calls go to a
  new connection. The error code and debug data are named in every error it causes.
- Incoming messages larger than `max_message_bytes` end their call with RESOURCE_EXHAUSTED; a frame
  over 16 KiB or a header block over 1 MiB ends the connection (a protocol error): nothing a worker
  sends is buffered without a bound.
"""

from __future__ import annotations

import asyncio
import socket

import grpc

from router.grpc.call import StreamCall
from router.grpc.http2 import (
    ACK,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    ERROR_NAMES,
    GOAWAY,
    HEADERS,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    PUSH_PROMISE,
    REFUSED_STREAM,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    HeaderDecoder,
    frame,
)
from router.grpc.slots import StreamSlots

# NOTE: large receive windows, so a worker never waits on us; topped up when half is used.
_RECV_WINDOW = 1 << 24
_DEFAULT_WINDOW = 65535
_MAX_FRAME = 16384  # the HTTP/2 default we leave in place: no frame from a worker may be larger
_MAX_HEADER_BLOCK = 1 << 20  # HEADERS + CONTINUATION of one block (a worker's are ~100 bytes)

# HTTP/2 error code of RST_STREAM -> gRPC status (gRPC's PROTOCOL-HTTP2.md).
_RST_CODES = {0x7: grpc.StatusCode.UNAVAILABLE, 0x8: grpc.StatusCode.CANCELLED,
              0xB: grpc.StatusCode.RESOURCE_EXHAUSTED, 0xC: grpc.StatusCode.PERMISSION_DENIED}


class ProtocolError(Exception):
    pass


class Connection(asyncio.Protocol):
    """One HTTP/2 connection to a worker. `ready` resolves with the worker's first SETTINGS."""

    def __init__(self, loop: asyncio.AbstractEventLoop, address: str, keepalive_s: float,
                 max_message_bytes: int, on_goaway=None):
        self.loop = loop
        self.address = address
        self.keepalive_s = keepalive_s
        self.max_message_bytes = max_message_bytes
        self.on_goaway = on_goaway  # callback(conn) when a GOAWAY arrives
        self.transport: asyncio.Transport | None = None
        self.ready: asyncio.Future = loop.create_future()
        self.ready.add_done_callback(lambda f: f.cancelled() or f.exception())  # may fail unobserved
        self.streams: dict[int, StreamCall] = {}
        self.next_stream_id = 1
        self.usable = True  # False after GOAWAY, a lost connection or stream ids running out
        self.broken_reason = ""
        self.goaway: tuple[int, int, bytes] | None = None  # (error code, last stream id, debug data)
        self.pings_sent = 0
        self.peer_initial_window = _DEFAULT_WINDOW
        self.peer_max_frame = 16384
        self.send_window = _DEFAULT_WINDOW
        self.slots = StreamSlots(loop, address, lambda: len(self.streams))  # MAX_CONCURRENT_STREAMS
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
        self._keepalive = self.loop.call_later(self.keepalive_s, self._check_alive)

    def connection_lost(self, exc) -> None:
        reason = f"connection to {self.address} lost" + (f": {exc}" if exc else "")
        if self.goaway is not None:
            reason += f" after {self.goaway_text()}"
        self._broken(reason)

    def data_received(self, data: bytes) -> None:
        self._last_read = self.loop.time()
        buf = self._buf + data if self._buf else data
        pos, n = 0, len(buf)
        try:
            while n - pos >= 9:
                length = int.from_bytes(buf[pos:pos + 3], "big")
                if length > _MAX_FRAME:
                    raise ProtocolError(f"a {length}-byte frame (we accept {_MAX_FRAME}: SETTINGS_MAX_FRAME_SIZE)")
                if n - pos - 9 < length:
                    break
                kind, flags = buf[pos + 3], buf[pos + 4]
                stream_id = int.from_bytes(buf[pos + 5:pos + 9], "big") & 0x7FFFFFFF
                self._on_frame(kind, flags, stream_id, buf[pos + 9:pos + 9 + length])
                pos += 9 + length
        except ProtocolError as e:
            self._broken(f"HTTP/2 protocol error from {self.address}: {e}")
            self.transport.close()
            return
        self._buf = buf[pos:]

    # ------------------------------------------------------------------ frames
    def _on_frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._header_block is not None and kind != CONTINUATION:
            raise ProtocolError("expected CONTINUATION")
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
                raise ProtocolError("unexpected CONTINUATION")
            self._header_block[2].extend(payload)
            if len(self._header_block[2]) > _MAX_HEADER_BLOCK:
                raise ProtocolError(f"a header block over {_MAX_HEADER_BLOCK} bytes")
            if flags & END_HEADERS:
                self._end_header_block()
        elif kind == RST_STREAM:
            call = self.streams.get(stream_id)
            if call is not None:
                code = int.from_bytes(payload[:4], "big")
                if code == REFUSED_STREAM and call._request is not None and self.usable:
                    self._on_refused(call)
                else:
                    call._finish(_RST_CODES.get(code, grpc.StatusCode.INTERNAL),
                                 f"stream reset by the worker (HTTP/2 {ERROR_NAMES.get(code, code)})")
        elif kind == SETTINGS:
            if not flags & ACK:
                self._on_settings(payload)
        elif kind == PING:
            if flags & ACK:
                self._ping_sent_at = None
            else:
                self.transport.write(frame(PING, ACK, 0, payload))
        elif kind == GOAWAY:
            self._on_goaway(payload)
        elif kind == WINDOW_UPDATE:
            increment = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
            if stream_id == 0:
                self.send_window += increment
                # NOTE: grpc-core sends these several times per call; only a call with request
                # bytes still unsent has anything to resume.
                for call in [c for c in self.streams.values() if c._pending]:
                    self._send_pending(call)
            else:
                call = self.streams.get(stream_id)
                if call is not None:
                    call.send_window += increment
                    self._send_pending(call)
        elif kind == PUSH_PROMISE:
            raise ProtocolError("server push was disabled")
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
            raise ProtocolError(str(e)) from None
        call = self.streams.get(stream_id)
        if call is not None:
            call._on_headers(headers, bool(flags & END_STREAM))

    def _on_settings(self, payload: bytes) -> None:
        for i in range(0, len(payload) - 5, 6):
            key, value = int.from_bytes(payload[i:i + 2], "big"), int.from_bytes(payload[i + 2:i + 6], "big")
            if key == 0x3:  # MAX_CONCURRENT_STREAMS
                self.slots.limit = value
            elif key == 0x4:  # INITIAL_WINDOW_SIZE: applies to every open stream as a delta
                delta, self.peer_initial_window = value - self.peer_initial_window, value
                for call in self.streams.values():
                    call.send_window += delta
            elif key == 0x5:  # MAX_FRAME_SIZE
                self.peer_max_frame = value
        self.transport.write(frame(SETTINGS, ACK, 0))
        if not self.ready.done():
            self.ready.set_result(None)
        for call in list(self.streams.values()):
            self._send_pending(call)
        self.slots.hand_on()

    def _on_goaway(self, payload: bytes) -> None:
        last = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
        self.goaway = (int.from_bytes(payload[4:8], "big"), last, bytes(payload[8:]))
        self.usable = False
        self.broken_reason = f"the worker at {self.address} is going away ({self.goaway_text()})"
        for sid, call in list(self.streams.items()):
            if sid > last:  # never processed by the worker: safe to retry elsewhere
                call._finish(grpc.StatusCode.UNAVAILABLE, f"{self.broken_reason}; the call was not processed")
        self.slots.release_all()
        if self.on_goaway is not None:
            self.on_goaway(self)
        if not self.streams and self.transport is not None:
            self.transport.close()

    def goaway_text(self) -> str:
        code, _, debug = self.goaway
        text = f"GOAWAY {ERROR_NAMES.get(code, hex(code))}"
        return text + (f": {debug.decode('utf-8', 'replace')}" if debug else "")

    # ------------------------------------------------------------------ calls
    def start(self, header_block: bytes, message: bytes, deserialize, deadline: float) -> StreamCall:
        call = StreamCall(self, 0, deserialize)
        call._timer = self.loop.call_at(deadline, call._on_deadline)
        # flag byte 0 + 4-byte length; both kept until the worker answers (a refused stream is resent)
        call._request = (header_block, len(message).to_bytes(5, "big") + message)
        self._open_stream(call)
        return call

    def _open_stream(self, call: StreamCall) -> None:
        stream_id = self.next_stream_id
        self.next_stream_id += 2
        if self.next_stream_id > (1 << 30):
            self.usable = False  # NOTE: ids run out at 2^31; the channel opens a new connection
        call.stream_id = stream_id
        call.send_window = self.peer_initial_window
        self.streams[stream_id] = call
        header_block, call._pending = call._request
        # NOTE: HEADERS and the first DATA frames leave in one write: one syscall, and the worker
        # usually reads the whole request at once.
        self._send_pending(call, frame(HEADERS, END_HEADERS, stream_id, header_block))

    def _on_refused(self, call: StreamCall) -> None:
        """REFUSED_STREAM: the worker did not process the call (RFC 9113 8.7), so it is sent again on
        a new stream after a short backoff, within its deadline. grpc-core refuses a stream over its
        MAX_CONCURRENT_STREAMS while it still counts a call whose trailers we already read."""
        self.streams.pop(call.stream_id, None)
        call._refusals += 1
        self.loop.call_later(min(0.005 * 2 ** call._refusals, 0.5), self._resend, call)
        self.slots.hand_on()

    def _resend(self, call: StreamCall) -> None:
        if call._status is not None:
            return  # cancelled or past its deadline meanwhile
        if not self.usable:
            call._finish(grpc.StatusCode.UNAVAILABLE, f"the worker refused the stream; {self.broken_reason}")
            return
        self._open_stream(call)

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
        else:
            self.slots.hand_on()

    # ------------------------------------------------------------------ failure
    def _check_alive(self) -> None:
        now = self.loop.time()
        keepalive = self.keepalive_s
        if self._ping_sent_at is not None and now - self._ping_sent_at >= keepalive:
            self._broken(f"the worker at {self.address} stopped answering pings")
            self.transport.close()
            return
        # NOTE: the PING ACK counts as a read, so pings are at least keepalive_s apart as the worker
        # sees them, however late it answers.
        if self.streams and self._ping_sent_at is None and now - self._last_read >= keepalive:
            self._ping_sent_at = now
            self.pings_sent += 1
            self.transport.write(frame(PING, 0, 0, bytes(8)))
        self._keepalive = self.loop.call_later(keepalive / 2, self._check_alive)

    def _broken(self, reason: str) -> None:
        self.usable = False
        self.broken_reason = reason
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None
        if not self.ready.done():
            self.ready.set_exception(ConnectionError(reason))
        for call in list(self.streams.values()):
            call._finish(grpc.StatusCode.UNAVAILABLE, reason)
        self.streams.clear()
        self.slots.release_all()

    def close(self) -> None:
        self._broken(f"channel to {self.address} closed")
        if self.transport is not None:
            self.transport.close()

    def retire(self) -> None:
        """No new calls; the calls open go on and the connection closes after the last (forget)."""
        self.usable = False
        self.broken_reason = f"channel to {self.address} closed"
        self.slots.release_all()
        if not self.streams:
            self.close()
