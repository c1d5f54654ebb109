"""Closing a Mooncake client without stopping every thread of the process.

With HA masters (an `etcd://` master address) the installed Mooncake client's close() joins its
leader-monitor thread, which sits in an etcd wait of up to 30 s, and close() holds the GIL the whole
time: every Python thread stops (measured in docs/benchmarks.md, "Store back after a leader switch":
30.2 s closed 0.5 s after setup, 18.7 s closed 12 s after, a ticker thread frozen throughout). A
thread of its own would not help, the GIL stops them all; so an HA client is closed at process exit,
when nothing serves any more. A single master's client closes in about a second, at once.

Until exit the parked client keeps its segment mounted (its pages stay readable by the others, the
master forgets it at exit); the worker has unregistered its buffers before parking it.
"""

from __future__ import annotations

import atexit
import logging
import threading

log = logging.getLogger(__name__)

_parked: list = []
_lock = threading.Lock()


def close_client(raw, ha: bool) -> None:
    """Close `raw` (a MooncakeDistributedStore) now, or at process exit for HA masters."""
    if not ha:
        _close(raw)
        return
    with _lock:
        if not _parked:
            atexit.register(close_parked)
        _parked.append(raw)
    log.info("store client with HA masters parked: closed at process exit (its close holds the GIL up to 30 s)")


def close_parked() -> None:
    """At exit: close every parked client (each may hold the GIL up to 30 s; nothing serves now)."""
    with _lock:
        clients = list(_parked)
        _parked.clear()
    for raw in clients:
        _close(raw)


def parked() -> int:
    """How many clients wait for process exit (tests)."""
    with _lock:
        return len(_parked)


def _close(raw) -> None:
    try:
        raw.close()
    except Exception:  # best effort at shutdown
        log.warning("closing the store client failed", exc_info=True)
