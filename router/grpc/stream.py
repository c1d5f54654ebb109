"""A lean gRPC client for the router's hot call: server-streaming calls over one HTTP/2 connection.

Why not grpc.aio: it was most of the router's CPU (bench/router_overhead/): every streamed message
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

    router/grpc/stream.py  Channel: connecting, the header block, which connection a call goes on
    router/grpc/conn.py    Connection: frames, flow control, keepalive, stream limit, GOAWAY
    router/grpc/call.py    StreamCall, RpcError: one call's messages and status
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable

import grpc

from router.grpc.call import RpcError, StreamCall, grpc_timeout
from router.grpc.conn import Connection
from router.grpc.http2 import ENHANCE_YOUR_CALM, literal, literal_indexed_name

__all__ = ["KEEPALIVE_S", "MAX_MESSAGE_BYTES", "Channel", "RpcError", "StreamCall"]

log = logging.getLogger("pdorch.router")

# NOTE: consistent with the workers' server policy (pdorch/worker/main.py GRPC_OPTIONS: pings
# permitted every 4 s): with calls open and nothing read for this long, ping; no answer in as long
# -> the connection is broken.
KEEPALIVE_S = 10.0
MAX_MESSAGE_BYTES = 4 << 20  # gRPC's default receive limit; a Generate message is a few tokens


def _retrieve(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()


class Channel:
    """Calls to one worker (`host:port`) over one HTTP/2 connection, (re)connected on demand."""

    def __init__(self, address: str, keepalive_s: float = KEEPALIVE_S, max_message_bytes: int = MAX_MESSAGE_BYTES,
                 authorization: str | Callable[[], str] = "", ssl_context: ssl.SSLContext | None = None,
                 server_hostname: str = ""):
        """`authorization`: the value of the header every call carries (the workers' shared token, see
        pdorch/worker/tokens.py), or a function giving it per call (it changes during a token
        rotation); `ssl_context`: TLS with ALPN h2, the certificate checked for `server_hostname`
        (default: the address's host)."""
        self.address = address
        self.keepalive_s = keepalive_s
        self.max_message_bytes = max_message_bytes
        host, _, port = address.rpartition(":")
        self._host, self._port = host.strip("[]") or "127.0.0.1", int(port)
        self._ssl = ssl_context
        self._server_hostname = (server_hostname or self._host) if ssl_context is not None else None
        # NOTE: header fields every call sends alike, encoded once per path and authorization value
        # (:scheme is static table 7 or 6).
        self._scheme = b"\x87" if ssl_context is not None else b"\x86"
        self._authorization = authorization if callable(authorization) else (lambda: authorization)
        self._conn: Connection | None = None
        self._connecting: asyncio.Future | None = None
        self._authority = address.encode()
        self._header_prefix: dict[tuple[str, str], bytes] = {}  # (path, authorization) -> block but grpc-timeout
        self._closed = False

    async def call(self, path: str, message: bytes, deserialize, timeout_s: float,
                   metadata: tuple[tuple[str, str], ...] = ()) -> StreamCall:
        """Start a server-streaming call; connection failures raise RpcError(UNAVAILABLE). `metadata`:
        the call's own header fields (a trace's `traceparent`: pdorch/tracing/propagation.py)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            conn = self._conn
            if conn is None or not conn.usable:
                conn = await self._connect(loop, deadline)
            # NOTE: no await between a granted stream and start(): the stream count stays exact.
            if (conn.slots.free() or await conn.slots.acquire(deadline)) and conn.usable:
                break
        authorization = self._authorization()
        prefix = self._header_prefix.get((path, authorization))
        if prefix is None:
            prefix = self._header_prefix[(path, authorization)] = (
                b"\x83" + self._scheme  # :method POST (static table 3), :scheme
                + (literal(b"authorization", authorization.encode()) if authorization else b"")
                + literal_indexed_name(4, path.encode()) + literal_indexed_name(1, self._authority)
                + literal_indexed_name(31, b"application/grpc") + literal(b"te", b"trailers"))
        headers = prefix + literal(b"grpc-timeout", grpc_timeout(deadline - loop.time()))
        for name, value in metadata:
            headers += literal(name.encode(), value.encode())
        return conn.start(headers, message, deserialize, deadline)

    async def _connect(self, loop: asyncio.AbstractEventLoop, deadline: float) -> Connection:
        if self._closed:
            raise RpcError(grpc.StatusCode.UNAVAILABLE, f"channel to {self.address} is closed")
        if self._connecting is None:  # NOTE: concurrent first calls share one connection attempt
            self._connecting = loop.create_task(self._open(loop))
            self._connecting.add_done_callback(_retrieve)  # a timed-out attempt may fail unobserved
        connecting = self._connecting
        try:
            # NOTE: asyncio.timeout, not wait_for: on Python 3.11 wait_for drops a cancel (a client gone)
            # that comes in the same loop pass as the connection
            async with asyncio.timeout(max(0.0, deadline - loop.time())):
                conn = await asyncio.shield(connecting)
        except TimeoutError:
            raise RpcError(grpc.StatusCode.DEADLINE_EXCEEDED, f"connecting to {self.address} timed out") from None
        except OSError as e:
            raise RpcError(grpc.StatusCode.UNAVAILABLE, f"failed to connect to {self.address}: {e}") from None
        finally:
            if connecting.done() and self._connecting is connecting:
                self._connecting = None
        return conn

    async def _open(self, loop: asyncio.AbstractEventLoop) -> Connection:
        old = self._conn
        _, conn = await loop.create_connection(
            lambda: Connection(loop, self.address, self.keepalive_s, self.max_message_bytes, self._on_goaway),
            self._host, self._port, ssl=self._ssl, server_hostname=self._server_hostname)
        try:
            # NOTE: the worker's SETTINGS first: its stream limit holds from the first call. Bounded,
            # so a frozen worker or a black-holed path does not hold every later call's connect.
            async with asyncio.timeout(self.keepalive_s):  # NOTE: not wait_for (see _connect)
                await conn.ready
        except TimeoutError:
            conn.close()
            raise ConnectionError(f"no HTTP/2 SETTINGS within {self.keepalive_s:g} s") from None
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        if old is not None and not old.streams:
            old.close()  # NOTE: a GOAWAY'd connection with calls still open closes when they end
        return conn

    def _on_goaway(self, conn: Connection) -> None:
        code, _, debug = conn.goaway
        if code == ENHANCE_YOUR_CALM and debug == b"too_many_pings":
            # As grpc-core's own client does: the worker's ping policy is stricter than ours.
            self.keepalive_s *= 2
            log.warning("worker %s: %s; pinging every %.0f s from now on", self.address, conn.goaway_text(),
                        self.keepalive_s)
        elif code:
            log.warning("worker %s: %s", self.address, conn.goaway_text())

    def close(self, graceful: bool = False) -> None:
        """No more calls. `graceful`: the calls open go on to their end (a worker that left discovery
        to drain streams them to the end, or hands them on: pdorch/worker/main.py); else they fail."""
        self._closed = True
        if self._connecting is not None:
            self._connecting.cancel()
        if self._conn is not None:
            self._conn.retire() if graceful else self._conn.close()
