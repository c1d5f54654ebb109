"""Prefetch policies: how long a prefill task waits for its store load (`prefill.prefetch_policy`).

    wait_complete  wait until the load completes (its pages that failed become holes)
    timeout        wait at most base_s + per_page_s x pages loaded, then compute the pages instead
    best_effort    never while the scheduler has nothing else to compute: compute them instead

Giving up on a load that still runs (`give_up`): the load writes straight into the task's pool
pages (`batch_get_into` into their addresses, in Mooncake's threads), so the task must not compute
into those pages while the load may still write them. It takes FRESH pages for every page of the
load and leaves the old ones to the load (`task.load.late`); the load's completion settles them
(`settle_late`): a page that arrived enters L1 under its hash when no other page holds that hash
(the task's own computed page usually does by then), every other one is released. Pages are
released only by that completion: nothing touches them any more then (docs/workers.md,
"Prefetch policies").

    before   page_ids  [ L1 | s1 | s2 | tail ]      load -> s1, s2
    give up  page_ids  [ L1 | f1 | f2 | tail ]      load -> s1, s2 (task.load.late, held until it completes)
             todo      f1, f2 (holes), then the tail

The task gives back its STORE_LOAD lease (prefill_node/leases.py) when it gives up on the load: its
own pages are free of I/O from then on and go back as usual; `cached` counts no page of the load
(they are computed).

Owns `task.load` (LoadWait, prefill_node/task.py). Runs on the scheduler thread only (it touches
the allocator).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import Counter

from pdorch.config import PrefillConfig
from pdorch.tracing import names
from prefill_node import prefix
from prefill_node.leases import STORE_LOAD
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
    def from_config(cls, pc) -> PrefetchPolicy:
        return cls(pc.prefetch_policy, pc.prefetch_timeout_base_s, pc.prefetch_timeout_per_page_s)

    def budget_s(self, num_pages: int) -> float:
        """policy timeout: how long a load of `num_pages` pages is waited for."""
        return self.base_s + self.per_page_s * num_pages


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


class Prefetch:
    """Applies the policy to the tasks waiting for their store load; settles the loads given up on."""

    def __init__(self, rt, cfg: PrefillConfig, metrics: PrefetchMetrics):
        self._rt = rt
        self.policy = PrefetchPolicy.from_config(cfg)
        self._prefix_cache = cfg.prefix_cache
        self.metrics = metrics

    def started(self, task: PrefillTask, now: float) -> None:
        """prefix.admit() submitted the task's store load (task.prefix.loading) just now."""
        task.load.open = True
        if self.policy.name == TIMEOUT:
            task.load.wait_until = now + self.policy.budget_s(len(task.prefix.loading))

    def completed(self, task: PrefillTask) -> None:
        """The task's store load completed while the task still waited for it."""
        task.load.open = False

    def apply(self, tasks, now: float, wake_at) -> None:
        """Stop waiting for the loads the policy gives up on now; `wake_at(t)`: look again at t."""
        if self.policy.name == WAIT_COMPLETE:
            return
        waiting = [t for t in tasks if t.load.open and not t.finished_phase]
        if self.policy.name == BEST_EFFORT:
            # NOTE: only when nothing is to compute: a forward that runs anyway gives the load its time.
            if any(t.phase is Phase.COMPUTING for t in tasks):
                return
            due = waiting
        else:
            due = [t for t in waiting if now >= t.load.wait_until]
            for t in waiting:
                if t not in due:
                    wake_at(t.load.wait_until)
        for task in due:
            self.give_up(task)

    def give_up(self, task: PrefillTask) -> bool:
        """Compute the task's store-load pages in fresh pages and leave the old ones to the load.
        False (it keeps waiting) when the pool cannot give fresh pages without dropping pages the
        store lacks: waiting costs time, never a page."""
        alloc, loading = self._rt.allocator, task.prefix.loading
        if alloc.num_available_without_loss() < len(loading):
            return False
        task.load.late = prefix.swap_loading(task, alloc.allocate(len(loading)))
        task.load.open = False
        task.io.give_back(STORE_LOAD)  # the load touches only task.load.late now
        task.load.given_up_pages = len(loading)
        self.metrics.given_up.labels(self.policy.name).inc(len(loading))
        prefix.on_loaded(task, self._rt, list(loading), (), self._prefix_cache,  # none arrived: holes
                         miss_reasons=[names.MISS_GIVEN_UP] * len(loading))
        return True

    def settle_late(self, task: PrefillTask, page_ok) -> None:
        """The load the task gave up on completed: nothing writes its pages any more."""
        alloc, late = self._rt.allocator, task.load.late
        ok = list(page_ok) + [False] * (len(late) - len(page_ok))
        entered = 0
        for (i, page), good in zip(late, ok):
            if good and self._prefix_cache and alloc.cache(task.prefix.hashes[i], page) == page:
                alloc.mark_persisted([page])  # read from the store: it holds the page
                entered += 1
        alloc.release([page for _, page in late])
        self.metrics.late.labels("entered_l1").inc(entered)
        self.metrics.late.labels("freed").inc(len(late) - entered)
        task.load.late = []
