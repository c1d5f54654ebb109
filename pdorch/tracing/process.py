"""The worker process's one Tracing, set once at start (pdorch/worker/main.py) before the worker is built.

A worker process has exactly one; code deep in a worker (scheduler, I/O threads) reads it here instead of
having it threaded through every constructor. NO_TRACING until set, so unit tests that build workers in
process trace nothing. The router passes its Tracing explicitly (RouterService.tracing) instead.
"""

from __future__ import annotations

from pdorch.tracing.setup import NO_TRACING, Tracing

_process = NO_TRACING


def set_process_tracing(tracing: Tracing) -> None:
    global _process
    _process = tracing


def process_tracing() -> Tracing:
    return _process
