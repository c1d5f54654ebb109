"""Free TCP ports for servers started on loopback (the store's master helper, tests, benchmarks).

NOTE: asking the kernel for port 0 returns a port from the ephemeral range, which the kernel also
hands out as the local port of outgoing connections. Between choosing the port and the server
binding it, any connection the machine opens (a test suite opens thousands) can take it, and the
server fails with "address already in use". Ports below the ephemeral range are never picked for
outgoing connections, so a port free now stays free for whoever it was chosen for.
"""

from __future__ import annotations

import random
import socket

_EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
_LOWEST = 10000  # below: well-known and registered services
_handed_out: set[int] = set()


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
    """A port that is free now, below the ephemeral range, and not returned before by this process."""
    top = _ephemeral_start()
    if top - _LOWEST >= 1000:
        for _ in range(200):
            port = random.randrange(_LOWEST, top)
            if port not in _handed_out and _bindable(host, port):
                _handed_out.add(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # an unusual range: the kernel's choice
        s.bind((host, 0))
        port = s.getsockname()[1]
    _handed_out.add(port)
    return port
