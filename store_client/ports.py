"""Free TCP ports for servers started on loopback (the store's master helper, tests, benchmarks).

NOTE: asking the kernel for port 0 returns a port from the ephemeral range, which the kernel also
hands out as the local port of outgoing connections. Between choosing the port and the server
binding it, any connection the machine opens (a test suite opens thousands) can take it, and the
server fails with "address already in use". Ports below the ephemeral range are never picked for
outgoing connections, so a port free now stays free for whoever it was chosen for.

Two ranges below it are Mooncake's own: a store client whose local_hostname has no port binds one in
12300-14300, and the transfer engine's handshake listener one in 15000-17000 (both random, both
after we chose ours). A worker started on a port from those ranges could find its own store client
sitting on it (seen in CI: prefill's gRPC port taken by its own transfer engine), so they are skipped.
"""

from __future__ import annotations

import random
import socket

_EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
_LOWEST = 10000  # below: well-known and registered services
_MOONCAKE_RANGES = ((12300, 14300), (15000, 17000))  # inclusive; MC_STORE_CLIENT_*/MC_MIN_RPC_PORT defaults
_handed_out: set[int] = set()


def mooncake_may_take(port: int) -> bool:
    return any(low <= port <= high for low, high in _MOONCAKE_RANGES)


def _ephemeral_start() -> int:
    try:
        with open(_EPHEMERAL_RANGE) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free now, below the ephemeral range and outside Mooncake's, not returned before
    by this process."""
    top = _ephemeral_start()
    if top - _LOWEST >= 1000:
        for _ in range(400):
            port = random.randrange(_LOWEST, top)
            if port not in _handed_out and not mooncake_may_take(port) and _bindable(host, port):
                _handed_out.add(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # an unusual range: the kernel's choice
        s.bind((host, 0))
        port = s.getsockname()[1]
    _handed_out.add(port)
    return port


def free_port_run(count: int, host: str = "127.0.0.1") -> int:
    """A base port whose `count` consecutive ports are free and outside Mooncake's ranges (worker i
    of a launch plan listens on base + i)."""
    for _ in range(50):
        base = free_port(host)
        rest = [base + i for i in range(1, count)]
        if all(p not in _handed_out and not mooncake_may_take(p) and _bindable(host, p) for p in rest):
            _handed_out.update(rest)
            return base
    raise RuntimeError(f"no {count} consecutive free ports found on {host}")
