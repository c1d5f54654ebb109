"""Prefetch policies: how long a prefill task waits for its store load (`prefill.prefetch_policy`).

    wait_complete  wait until the load completes (its pages that failed become holes)
    timeout        wait at most base_s + per_page_s x pages loaded, then compute the pages instead
    best_effort    never while the scheduler has nothing else to compute: compute them instead

Giving up on a load that still runs (`PrefillAdmission._give_up`): the load writes straight into the task's pool
pages (`batch_get_into` into their addresses, in Mooncake's threads), so the task must not compute
into those pages while the load may still write them. It takes FRESH pages for every page of the
load and leaves the old ones to the load (`task.load.late`); the load's completion settles them
(`PrefillAdmission._settle_late`): a page that arrived enters L1 under its hash when no other page
holds that hash (the task's own computed page usually does by then), every other one is released. Pages are
released only by that completion: nothing touches them any more then (docs/workers.md,
"Prefetch policies").

    before   page_ids  [ L1 | s1 | s2 | tail ]      load -> s1, s2
    give up  page_ids  [ L1 | f1 | f2 | tail ]      load -> s1, s2 (task.load.late, held until it completes)
             todo      f1, f2 (holes), then the tail

The task gives back its STORE_LOAD lease (prefill_node/leases.py) when it gives up on the load: its
own pages are free of I/O from then on and go back as usual; `cached` counts no page of the load
(they are computed).

This file is the policy only (when to give up: `PrefetchPolicy.due`); the load, its lease and
`task.load` (LoadWait) belong to the admission phase, which gives up and settles the late pages
(prefill_node/admission.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import Counter

from pdorch.config import PrefillConfig
from prefill_node.task import Phase, PrefillTask

WAIT_COMPLETE = "wait_complete"
TIMEOUT = "timeout"
BEST_EFFORT = "best_effort"


@dataclass(frozen=True)
class PrefetchPolicy:
    name: str = WAIT_COMPLETE
    base_s: float = 1.0
    per_page_s: float = 0.004

    def __post_init__(self):
        if self.name not in (WAIT_COMPLETE, TIMEOUT, BEST_EFFORT):
            raise ValueError(f"prefill.prefetch_policy: unknown policy {self.name!r}")

    @classmethod
    def from_config(cls, pc: PrefillConfig) -> PrefetchPolicy:
        return cls(pc.prefetch_policy, pc.prefetch_timeout_base_s, pc.prefetch_timeout_per_page_s)

    def budget_s(self, num_pages: int) -> float:
        """policy timeout: how long a load of `num_pages` pages is waited for."""
        return self.base_s + self.per_page_s * num_pages

    def wait_until(self, now: float, num_pages: int) -> float:
        """A load of `num_pages` pages submitted at `now`: when its task stops waiting for it (inf: never
        by the clock)."""
        return now + self.budget_s(num_pages) if self.name == TIMEOUT else float("inf")

    def due(self, tasks: Iterable[PrefillTask], now: float, wake_at: Callable[[float], None]) -> list[PrefillTask]:
        """The tasks whose store load the policy gives up on now; `wake_at(t)`: look again at t."""
        if self.name == WAIT_COMPLETE:
            return []
        tasks = list(tasks)
        waiting = [t for t in tasks if t.load.open and not t.finished_phase]
        if self.name == BEST_EFFORT:
            # NOTE: only when nothing is to compute: a forward that runs anyway gives the load its time.
            return [] if any(t.phase is Phase.COMPUTING for t in tasks) else waiting
        due = [t for t in waiting if now >= t.load.wait_until]
        for t in waiting:
            if t not in due:
                wake_at(t.load.wait_until)
        return due


class PrefetchMetrics:
    def __init__(self, registry):
        p = "pdorch_prefill_prefetch_"
        self.given_up = Counter(p + "given_up_pages", "Prefix pages whose store load a request stopped waiting "
                                "for (prefill.prefetch_policy) and computed instead, by policy", ["policy"],
                                registry=registry)
        self.late = Counter(p + "late_pages", "Pages of a store load given up on, once it completed: entered_l1 "
                            "(arrived, and no other page held its hash) or freed", ["outcome"], registry=registry)
        for name in (TIMEOUT, BEST_EFFORT):
            self.given_up.labels(name)
        for outcome in ("entered_l1", "freed"):
            self.late.labels(outcome)
