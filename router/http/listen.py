"""The router's listening sockets: several on one port (SO_REUSEPORT), all served by one event loop.

Why: uvloop's libuv accepts ONE connection per listening socket per loop turn, and a loop turn
under load includes writing a decode step's worth of token chunks. Clients that open a connection
per request (SGLang's benchmarks, curl, bench/router_overhead/) arrive in bursts, right after
their previous stream ended, and queued in the kernel for one turn each: connect -> accept was
2.0 ms p50 / 8.3 ms p90 at 64 streams. With ACCEPT_SOCKETS sockets the kernel spreads the
connections over them and a turn accepts up to that many: 0.4 ms p50 / 2.6 ms p90.

    listen_sockets("127.0.0.1", 8000) -> [socket, ...]   bound, not yet listening (uvicorn listens)
"""

from __future__ import annotations

import socket

ACCEPT_SOCKETS = 8


class PortInUse(Exception):
    pass


def listen_sockets(host: str, port: int, count: int = ACCEPT_SOCKETS) -> list[socket.socket]:
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]

    def bound(reuse_port: bool) -> socket.socket:
        s = socket.socket(family, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            s.bind(address)
        except OSError as e:
            s.close()
            raise PortInUse(f"cannot listen on {host}:{port}: {e.strerror}") from None
        return s

    # NOTE: a plain bind first, so a port taken by anything (another router included: it would
    # otherwise share the port through SO_REUSEPORT) fails with a clear error instead.
    bound(reuse_port=False).close()
    if not hasattr(socket, "SO_REUSEPORT"):
        count = 1  # NOTE: not Linux/BSD: one socket, one accept per loop turn
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sockets.append(bound(reuse_port=count > 1))
    except PortInUse:
        for s in sockets:
            s.close()
        raise
    return sockets
