"""A worker's drain, from SIGTERM to exit (pdorch/worker/main.py runs the steps in this order):

    leave discovery    etcd key revoked: routers drop the worker and their KV index forgets what it
                       held (router/kv/watch.py); a request routed just before gets UNAVAILABLE from
                       the stopped server and the router retries it on another pair (before its first token)
    finish work        prefill: running prefills get prefill.drain_timeout_s (the server refuses new
                       ones); decode: streams get decode.drain_timeout_s, the rest are handed to other
                       decode workers through the failover resume path (DecodeWorker.drain)
    write L1 back      the pages its L1 holds that the store lacks are written, retained until written,
                       for at most {role}.drain_writeback_s: the next turns read them from the store
    exit

Seen as pdorch_worker_draining (1 from SIGTERM on) and pdorch_worker_drain_remaining{kind}
(streams, prefills, writeback_pages: what the current step still waits for; 0 outside a drain).
`drain_budget_s` is the longest that takes when nothing hangs: the chart's
terminationGracePeriodSeconds check (charts/pdorch/templates/_worker.tpl) and the local fleet's
SIGKILL (pdorch/local_fleet.py) both follow it.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from pdorch.config import Config
from pdorch.worker.drain_writes import WriteBackProgress

log = logging.getLogger(__name__)

KINDS = ("streams", "prefills", "writeback_pages")
OUTCOMES = ("written", "failed", "skipped", "late")
# Past its two deadlines: the decode hand-off waits up to store.op_timeout_s + 5 s for the handed-on
# streams' pages, then the server's 2 s grace and the shutdown; the prefill server's shutdown.
SHUTDOWN_MARGIN_S = {"prefill": 5.0, "decode": 20.0}
POLL_S = 0.05


def drain_budget_s(cfg: Config, role: str) -> float:
    """Seconds from SIGTERM to exit when nothing hangs."""
    section = getattr(cfg, role)
    return section.drain_timeout_s + section.drain_writeback_s + SHUTDOWN_MARGIN_S[role]


class Drainable(Protocol):
    """What a drain asks of its worker (PrefillWorker, DecodeWorker)."""

    def in_flight(self) -> int:
        """The work a drain waits for: streams (decode) or prefills."""

    def start_write_back(self) -> int:
        """Start writing the L1 pages the store lacks (pdorch/worker/drain_writes.py); how many."""

    def write_back_progress(self) -> WriteBackProgress:
        """The write-back start_write_back started, so far."""


class WorkerDrain:
    """The drain's state and metrics."""

    def __init__(self, role: str, worker: Drainable, registry: CollectorRegistry):
        self.role, self.worker = role, worker
        self.draining = False
        self.writeback_left = 0
        Gauge("pdorch_worker_draining", "1 while the worker drains (out of discovery, finishing or handing on "
              "its work, writing its L1 back), else 0", registry=registry).set_function(lambda: int(self.draining))
        remaining = Gauge("pdorch_worker_drain_remaining", "What the drain still waits for, by kind: streams "
                          "(decode), prefills, writeback_pages (L1 pages being written back); 0 outside a drain",
                          ["kind"], registry=registry)
        for kind in KINDS:
            remaining.labels(kind).set_function(functools.partial(self.remaining, kind))
        self._written = Counter("pdorch_worker_drain_writeback_pages", "The drain's write-back of the L1 pages "
                                "the store lacked, by outcome: written, failed (dropped, timed out, no space), "
                                "skipped (written by another write or gone from L1 meanwhile), late (not landed "
                                "within {role}.drain_writeback_s)", ["outcome"], registry=registry)
        for outcome in OUTCOMES:
            self._written.labels(outcome)

    def remaining(self, kind: str) -> int:
        if not self.draining:
            return 0
        if kind == "writeback_pages":
            return self.writeback_left
        if kind == ("streams" if self.role == "decode" else "prefills"):
            return self.worker.in_flight()
        return 0

    def begin(self) -> None:
        self.draining = True

    def write_back(self, timeout_s: float) -> WriteBackProgress:
        """Write the L1 pages the store lacks, waiting up to timeout_s: what landed by then (`left`: the
        pages not written in time)."""
        if timeout_s <= 0:
            return WriteBackProgress(0)
        deadline = time.monotonic() + timeout_s
        try:
            progress = WriteBackProgress(self.worker.start_write_back())
            self.writeback_left = progress.left
            while self.writeback_left and time.monotonic() < deadline:
                time.sleep(POLL_S)
                progress = self.worker.write_back_progress()
                self.writeback_left = progress.left
        except Exception as e:  # noqa: BLE001 - the scheduler stopped or hangs: exit without the write-back
            log.warning("drain: L1 write-back failed: %s", e)
            return WriteBackProgress(0)
        for outcome, n in zip(OUTCOMES, (progress.written, progress.failed, progress.skipped, progress.left)):
            self._written.labels(outcome).inc(n)
        log.log(logging.WARNING if progress.failed or progress.left else logging.INFO,
                "drain: wrote %d of the %d L1 pages the store lacked back (%d failed, %d skipped, %d not in time)",
                progress.written, progress.total, progress.failed, progress.skipped, progress.left)
        return progress
