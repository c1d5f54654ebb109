"""The main thread's wait for SIGTERM / SIGINT, that cannot sleep through one.

CPython runs a signal's Python handler on the main thread, the next time that thread runs bytecode.
The kernel hands a process-directed signal to any thread that does not block it, not always the main
one; then an untimed `Event.wait()` on the main thread is never interrupted and sleeps through the
signal for good. Seen: a decode worker told to drain went on serving until its SIGKILL, 30 s later,
and its streams broke instead of being handed on. A timed wait returns to bytecode every `poll_s`,
and the handler runs then.
"""

from __future__ import annotations

import signal
import threading

POLL_S = 0.5


def stop_on_signals(signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> threading.Event:
    """An event set by any of `signals` (installs their handlers; call on the main thread)."""
    stop = threading.Event()
    for sig in signals:
        signal.signal(sig, lambda *_: stop.set())
    return stop


def wait_for_stop(stop: threading.Event, poll_s: float = POLL_S) -> None:
    """Block until `stop` is set, waking every `poll_s` so a pending signal's handler gets to run."""
    while not stop.wait(poll_s):
        pass
