"""What `pdorch serve` asks of its children's ports and URLs while it starts them."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

from pdorch.launch_plan import ChildSpec
from pdorch.ports import port_answers


def port_in_use(host: str, port: int) -> bool:
    """True when binding host:port fails.

    NOTE: gRPC servers bind with SO_REUSEPORT, so a second worker on a taken port would start
    silently and share the traffic; this check is what catches a stale cluster.
    """
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host or "0.0.0.0", port))
        except OSError:
            return True
    return False


PORT_LABELS = {"store.master_address": "rpc", "store.master_rpc_port": "rpc", "store.metadata_server": "metadata",
                "store.master_metrics_port": "metrics"}


def masters_ready(specs: list[ChildSpec]) -> bool:
    """Every master answers on its first port, and one on all of its ports: with masters in HA mode
    that one leads (a standby opens its RPC port only when it takes the lead)."""
    return (all(port_answers(s.host, s.ports[0][1]) for s in specs)
            and any(all(port_answers(s.host, p) for _, p in s.ports) for s in specs))


def health_ok(url: str, timeout_s: float) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False
