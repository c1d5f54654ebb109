"""Free TCP ports for local servers (store_client's helper: store_client depends on nothing in pdorch),
and whether a local server answers on its port yet."""

import socket

from store_client.ports import free_port, free_port_run

__all__ = ["free_port", "free_port_run", "port_answers"]


def port_answers(host: str, port: int) -> bool:
    """A TCP connect to host:port succeeds now (a wildcard listen host is dialled on loopback)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((host if host not in ("0.0.0.0", "") else "127.0.0.1", port)) == 0
