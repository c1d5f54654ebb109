"""In-flight prefix sharing on one prefill worker (`prefill.share_inflight_prefix`): a waiting task
whose reusable pages an admitted task is computing (or loading) right now waits for them instead of
computing them again, and is admitted as soon as every page it waits for is in L1. The step caches
each page in L1 as soon as it is computed (PrefillStep.run), so a task sharing only the
first pages of a longer prompt starts once those are done, not when the whole prompt is.

    task A (admitted)   pages | a0 a1 a2 a3 | tail      computing a0..a3 in chunks
    task B (arrives)    pages | a0 a1 a2 a3 | b4 tail   parked: waits for a0..a3 (claimed by A)
    A's chunks done          L1 gets a0..a3            B is admitted: L1 hits (tier "inflight"), computes b4, tail

Parked tasks leave the waiting queue, so the tasks behind them are admitted meanwhile; a parked task
goes back to the front (by arrival) when:
    shared        every page it waits for is in L1 (or no longer claimed and some arrived)
    owner_gone    its owners ended without caching a page it waits for (failed, aborted)
    not_cheaper   the owners have more left to compute before those pages than the task itself
                  (its own tokens of them): computing them here would be as fast
    deadline      its own estimated compute time no longer fits before its deadline

Why waiting is cheaper on one worker: compute is serial and oldest-first (step.py), so a duplicate
that computed the shared pages itself would compute them after the owner anyway, and both would
share each forward's token budget.

Across workers: an admitted task CLAIMS the reusable pages it loads or computes in the worker's KV
events (prefill_node/admission.py, which admits it). The router's index counts a claim as the
worker's L1 for a short while (router/kv/index.py), so a request sharing the prefix is routed here,
where it waits as above, when this worker's load allows.

The admission phase asks two things of this file: `park` (the head of its queue: wait?) and, once
an iteration, `ready` (which parked tasks go back). Runs on the scheduler thread only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter

from pdorch.worker.prompt_pages import reusable_pages
from prefill_node.task import Phase, PrefillTask
from store_client.page_hash import page_hashes

if TYPE_CHECKING:
    from pdorch.worker.runtime import WorkerRuntime
    from prefill_node.step import PrefillStep

OUTCOMES = ("shared", "owner_gone", "not_cheaper", "deadline")
DEADLINE_MARGIN = 1.5  # a parked task leaves when 1.5x its own compute estimate no longer fits before its deadline


class InFlightMetrics:
    def __init__(self, registry: CollectorRegistry | None):
        self.waits = Counter("pdorch_prefill_inflight_waits", "Requests that waited for prefix pages another request "
                             "was computing on this worker, by how the wait ended (shared: the pages arrived; "
                             "owner_gone; not_cheaper: computing them was as fast; deadline)", ["outcome"],
                             registry=registry)
        for outcome in OUTCOMES:
            self.waits.labels(outcome)
        self.pages = Counter("pdorch_prefill_inflight_pages", "Prompt pages reused from another request's in-flight "
                             "computation on this worker instead of being computed again", registry=registry)


@dataclass(eq=False)
class Parked:
    task: PrefillTask
    waits_for: frozenset[str]  # page hashes
    since: float


class InFlight:
    def __init__(self, rt: WorkerRuntime, metrics: InFlightMetrics, enabled: bool, step: PrefillStep):
        """`step`: its `seconds_per_token` (the forwards' recent cost) says what computing costs."""
        self._rt, self.metrics, self.enabled, self._step = rt, metrics, enabled, step
        self.parked: list[Parked] = []

    def park(self, task: PrefillTask, tasks: Iterable[PrefillTask], now: float) -> bool:
        """Park `task` (True) when pages it could reuse are in flight in an admitted task and waiting
        for them is cheaper than computing them; False: admit it as usual. A task parks at most once."""
        if task.inflight.waited_for or not self.enabled or task.job.params.prompt_logprobs is not None:
            return False  # waited already, or sharing off, or prompt logprobs (those reuse no page anyway)
        claims = self._claims(tasks, exclude=task)
        waits_for = frozenset(h for h in self._hashes(task) if h in claims and not self._cached(h))
        if not waits_for or self._why_stop(task, waits_for, waits_for, claims, now) is not None:
            return False
        task.inflight.waited_for, task.inflight.parked = waits_for, True
        self.parked.append(Parked(task, waits_for, now))
        return True

    def ready(self, tasks: Iterable[PrefillTask], now: float) -> None:
        """Send back to the admission queue (`task.inflight.parked` False) the parked tasks whose wait is
        over, each counted by outcome. A parked task that failed meanwhile is dropped (the scheduler
        releases it)."""
        if not self.parked:
            return
        claims = self._claims(tasks)
        keep = []
        for p in self.parked:
            if p.task.finished_phase:
                p.task.inflight.parked = False
                continue
            left = frozenset(h for h in p.waits_for if h in claims and not self._cached(h))
            why = self._why_stop(p.task, p.waits_for, left, claims, now)
            if why is None:
                keep.append(p)
                continue
            self.metrics.waits.labels(why).inc()
            p.task.inflight.parked = False
        self.parked = keep

    # ----------------------------------------------------------------------------------- internals
    def _why_stop(self, task: PrefillTask, waits_for: frozenset[str], left: frozenset[str], claims: dict,
                  now: float) -> str | None:
        """Why `task` stops waiting now (an outcome), or None: it keeps waiting for `left`."""
        if not left:
            return "shared" if any(self._cached(h) for h in waits_for) else "owner_gone"
        own = len(left) * self._rt.page_size  # what computing them itself costs, in tokens
        if sum(self._left_before(o, left, claims) for o in {claims[h] for h in left}) > own:
            return "not_cheaper"
        if now + DEADLINE_MARGIN * self._step.seconds_per_token * task.prompt_len >= task.deadline:
            return "deadline"
        return None

    def _left_before(self, owner: PrefillTask, pages: frozenset[str], claims: dict) -> int:
        """Tokens `owner` still computes before the last of `pages` it claims is complete (a loading
        owner, or one not planned yet: as if it computed every page it claims up to there)."""
        page_size = self._rt.page_size
        mine = [i for i, h in enumerate(owner.prefix.hashes) if claims.get(h) is owner]
        last = max((i for i in mine if owner.prefix.hashes[i] in pages), default=-1)
        todo = owner.compute.todo
        if owner.phase is not Phase.COMPUTING or todo is None:
            return sum(1 for i in mine if i <= last) * page_size
        end = (last + 1) * page_size
        return sum(max(0, min(e, end) - s) for s, e in todo)

    def _hashes(self, task: PrefillTask) -> list[str]:
        n = reusable_pages(task.prompt_len, self._rt.page_size)
        hashes = list(task.job.page_hashes) or page_hashes(list(task.job.token_ids), self._rt.page_size)
        return hashes[:n]

    def _claims(self, tasks: Iterable[PrefillTask], exclude: PrefillTask | None = None) -> dict[str, PrefillTask]:
        """hash -> the admitted, unfinished task holding that page uncached (it is loading or computing it)."""
        alloc = self._rt.allocator
        out: dict[str, PrefillTask] = {}
        for t in tasks:
            if t is exclude or t.finished_phase or t.phase is Phase.PUSHING or not t.page_ids:
                continue
            for h, page in zip(t.prefix.hashes, t.page_ids):
                if alloc.page_hash(page) is None:
                    out.setdefault(h, t)
        return out

    def _cached(self, page_hash: str) -> bool:
        return bool(self._rt.allocator.pages_of([page_hash]))
