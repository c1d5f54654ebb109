"""The admission phase of a prefill task: from its arrival on the scheduler thread to COMPUTING.

The scheduler calls `admit` once an iteration (every waiting task, oldest first) and routes the
completions of the reads admission started straight back here: `loaded` (the store load, tag
`PrefixLoaded`) and `read` (the read from D's pool, message `Read`). A task leaves this phase by
entering COMPUTING, where prefill_node/step.py takes it.

    waiting, oldest first --park? (inflight.py)--> parked --ready (inflight.py)--> waiting again
      --pool short? wait: pacing, write-before-evict (persistence.py), bounded by prefill.persist_wait_s
      --lookup (prefix.py): L1 hits, new pages, the plan
          nothing to read              --> COMPUTING
          a store load, a read from D  --> LOADING --completions, or the prefetch policy gives up
                                                     on the load (prefetch.py)--> COMPUTING

Owns what it starts: the STORE_LOAD and DECODE_READ leases (prefill_node/leases.py: taken when the
read is submitted, given back by its completion, or when the policy gives up on the load), the
task's `load` record (LoadWait, prefill_node/task.py), the pages of a load given up on (released by
its completion: docs/workers.md, "Prefetch policies"), and the CLAIMS of the reusable pages an
admitted task loads or computes, published in the worker's KV events (`inflight_claimed` /
`inflight_released`, pdorch/worker/kv_events.py) from its admission until it leaves LOADING and
COMPUTING (its pages are in L1 then, or it failed).

Runs on the scheduler thread only (it touches the allocator).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from prometheus_client import Counter

from engine.page_allocator import pages_for
from pdorch.config import PrefillConfig
from pdorch.tracing import worker_spans as ws
from pdorch.worker.prompt_pages import reusable_pages
from prefill_node import prefix, spans
from prefill_node.inflight import InFlight, InFlightMetrics
from prefill_node.leases import DECODE_READ, STORE_LOAD
from prefill_node.messages import PrefixLoaded, Read
from prefill_node.persistence import Persister
from prefill_node.prefetch import PrefetchMetrics, PrefetchPolicy
from prefill_node.pusher import KVPusher
from prefill_node.step import PrefillStep
from prefill_node.task import Phase, PrefillTask
from store_client.page_hash import store_key

if TYPE_CHECKING:
    from pdorch.worker.loop import SchedulerLoop
    from pdorch.worker.metrics import WorkerRecorder
    from pdorch.worker.runtime import WorkerRuntime
    from store_client.io_thread import IOCompletion

log = logging.getLogger(__name__)

Publish = Callable[[list[str]], None]


class PrefillAdmission:
    def __init__(self, rt: WorkerRuntime, cfg: PrefillConfig, persist: Persister, step: PrefillStep,
                 pusher: KVPusher, loop: SchedulerLoop, recorder: WorkerRecorder):
        """`persist`: its write-before-evict under pool pressure; `step`: the forwards' cost (inflight.py);
        `pusher`: the reads from D's pool; `loop`: where their completions are posted, and wake-ups."""
        self._rt, self._persist, self._pusher, self._rec = rt, persist, pusher, recorder
        self._post, self._wake_at = loop.post, loop.wake_at
        self._prefix_cache = cfg.prefix_cache
        self._persist_wait_s = cfg.persist_wait_s
        self.prefetch = PrefetchPolicy.from_config(cfg)
        self.prefetch_metrics = PrefetchMetrics(recorder.registry)
        self.inflight = InFlight(rt, InFlightMetrics(recorder.registry), cfg.share_inflight_prefix and cfg.prefix_cache,
                                 step)
        # (claimed, released): where claims go (the worker's KV event journal), once it is up
        self.publish: tuple[Publish, Publish] | None = None
        self._claims: dict[PrefillTask, list[str]] = {}  # admitted task -> the page hashes it claimed
        self._pressure_since: float | None = None  # when the head of the queue first lacked pages
        # (task, since): the head of the queue waiting since then for another task's I/O (_may_admit)
        self._paced: tuple[PrefillTask, float] | None = None
        self._last_cancel = float("-inf")  # when queued writes were last cancelled under pressure
        self._decode_pool_pages = Counter("pdorch_prefill_decode_pool_pages", "Prefix pages read from the decode "
                                          "worker's pool (its prefix cache held them; this L1 did not), by outcome "
                                          "(failed: computed here instead)", ["outcome"], registry=recorder.registry)
        for outcome in ("read", "failed"):
            self._decode_pool_pages.labels(outcome)

    # ----------------------------------------------------------------- what the scheduler calls
    def admit(self, tasks: Sequence[PrefillTask] | dict[PrefillTask, None]) -> None:
        """Once an iteration, with every task holding state (in arrival order): end the claims of tasks
        past COMPUTING, admit the waiting tasks (oldest first; a parked one whose wait is over goes
        back among them) until one must wait for pages, and give up the store loads the prefetch
        policy gives up on."""
        self._end_claims()
        self.inflight.ready(tasks, time.monotonic())
        for task in sorted((t for t in tasks if t.phase is Phase.WAITING and not t.inflight.parked),
                           key=lambda t: t.created):
            now = time.monotonic()
            if self.inflight.park(task, tasks, now):
                continue  # parked: the tasks behind it go on (prefill_node/inflight.py)
            if not self._may_admit(task, tasks, now) or not self._admit(task, now):
                break  # it waits for pages; so do the tasks behind it
        for task in self.prefetch.due(tasks, time.monotonic(), self._wake_at):
            self._give_up(task)

    def loaded(self, done: IOCompletion) -> None:
        """The store load of a task (tag PrefixLoaded) completed: its lease back, its pages into L1."""
        if not isinstance(done.tag, PrefixLoaded):
            raise TypeError(f"prefill admission: not a store load's tag {done.tag!r}")
        task = done.tag.task
        if task.load.late:  # the task gave up on this load: only its old pages waited for it
            self._settle_late(task, done.page_ok)
            return
        task.load.open = False
        task.io.give_back(STORE_LOAD)
        spans.store_read(task, done, self._rt.pool.page_nbytes)
        if task.finished_phase:
            return
        self._rec.count_store_loaded(done.pages_ok)
        if done.reason != "ok":
            log.debug("store load for %s: %d of %d pages, %s", task.request_id, done.pages_ok, done.num_pages,
                      done.reason)
        loading = task.prefix.loading
        if prefix.on_loaded(task, self._rt, loading, done.page_ok, self._prefix_cache, page_ssd=done.page_ssd,
                            miss_reasons=ws.page_misses(done, len(loading))):
            self._computing(task)

    def read(self, msg: Read) -> None:
        """The read of a task's prefix pages from D's pool returned (a pusher thread posted it)."""
        task = msg.task
        task.io.give_back(DECODE_READ)
        n = len(task.prefix.reading)
        self._decode_pool_pages.labels("failed" if msg.error else "read").inc(n)
        if not task.finished_phase and prefix.on_loaded(task, self._rt, task.prefix.reading, [msg.error is None] * n,
                                                        self._prefix_cache, from_decode=True):
            self._computing(task)

    # ------------------------------------------------------------------------------ admission
    def _admit(self, task: PrefillTask, now: float) -> bool:
        """Give the head of the queue its pages and start its reads; False: the pool lacks pages."""
        patient = self._persist.usable and self._prefix_cache and (
            self._pressure_since is None or now - self._pressure_since < self._persist_wait_s)
        task.admitted = now
        if not prefix.lookup(task, self._rt, self._prefix_cache, allow_loss=not patient):
            self._under_pressure(task, now, patient)
            return False  # wait for pages to come back (the deadline still applies)
        self._pressure_since = None
        spans.queued(task)
        self.inflight.metrics.pages.inc(task.prefix.inflight_pages)
        self._claim(task)
        if not task.prefix.loads_left:
            self._computing(task)
            return True
        task.advance(Phase.LOADING)
        if task.prefix.loading:
            self._load(task, now)
        if task.prefix.reading:
            self._read_from_decode(task)
        return True

    def _computing(self, task: PrefillTask) -> None:
        """Every reusable page is in place or known missing (task.prefix.holes): compute."""
        task.advance(Phase.COMPUTING)
        spans.prefix_matched(task)

    def _load(self, task: PrefillTask, now: float) -> None:
        """ONE store load of the pages lookup planned (`batch_get_into` straight into their pool pages)."""
        rt, loading = self._rt, task.prefix.loading
        assert rt.store_io is not None, "lookup plans a store load only with a store"
        keys = [store_key(rt.fingerprint, task.prefix.hashes[i]) for i in loading]
        rt.store_io.submit_load(PrefixLoaded(task), keys, rt.pool.page_addrs([task.page_ids[i] for i in loading]))
        task.io.take(STORE_LOAD)
        task.load.open = True
        task.load.wait_until = self.prefetch.wait_until(now, len(loading))

    def _read_from_decode(self, task: PrefillTask) -> None:
        """Read the prefix pages D's pool holds into ours (off this thread, through the push gate)."""
        task.io.take(DECODE_READ)
        local = self._rt.pool.page_addrs([task.page_ids[i] for i in task.prefix.reading])
        remote = [task.job.dest_page_addrs[i] for i in task.prefix.reading]
        try:
            self._pusher.read(task, local, remote, self._on_read)
        except BaseException:  # never started (pusher closed): no completion will come
            task.io.give_back(DECODE_READ)
            raise

    def _on_read(self, task: PrefillTask, err: Exception | None, nbytes: int, seconds: float) -> None:
        """Pusher thread: the read from D's pool is over; the scheduler routes it back to `read`."""
        try:
            spans.decode_read(task, err, nbytes, seconds, len(task.prefix.reading))
        finally:
            self._post(Read(task, err))

    # ---------------------------------------------------------------------- the prefetch policy
    def _give_up(self, task: PrefillTask) -> None:
        """Compute the task's store-load pages in fresh pages and leave the old ones to the load. Not
        when the pool cannot give fresh pages without dropping pages the store lacks: waiting costs
        time, never a page."""
        alloc, n = self._rt.allocator, len(task.prefix.loading)
        if alloc.num_available_without_loss() < n:
            return
        task.load.late, settled = prefix.give_up_load(task, self._rt, alloc.allocate(n), self._prefix_cache)
        task.load.open = False
        task.io.give_back(STORE_LOAD)  # the load touches only task.load.late now
        task.load.given_up_pages = n
        self.prefetch_metrics.given_up.labels(self.prefetch.name).inc(n)
        if settled:
            self._computing(task)

    def _settle_late(self, task: PrefillTask, page_ok: Sequence[bool]) -> None:
        """The load the task gave up on completed: nothing writes its pages any more."""
        alloc, late = self._rt.allocator, task.load.late
        ok = list(page_ok) + [False] * (len(late) - len(page_ok))
        entered = 0
        for (i, page), good in zip(late, ok):
            if good and self._prefix_cache and alloc.cache(task.prefix.hashes[i], page) == page:
                alloc.mark_persisted([page])  # read from the store: it holds the page
                entered += 1
        alloc.release([page for _, page in late])
        self.prefetch_metrics.late.labels("entered_l1").inc(entered)
        self.prefetch_metrics.late.labels("freed").inc(len(late) - entered)
        task.load.late = []

    # ---------------------------------------------------------------------------------- claims
    def _claim(self, task: PrefillTask) -> None:
        """The task was admitted: claim its reusable pages that L1 lacks (it loads or computes them)."""
        if not self.inflight.enabled or self.publish is None:
            return
        n = reusable_pages(task.prompt_len, self._rt.page_size)
        alloc = self._rt.allocator
        claimed = [h for h, page in zip(task.prefix.hashes[:n], task.page_ids) if alloc.page_hash(page) is None]
        if claimed:
            self._claims[task] = claimed
            self.publish[0](claimed)

    def _end_claims(self) -> None:
        """Claims end once their task leaves LOADING and COMPUTING: what it computed is in L1 by then
        (prefill_node/step.py caches each page it completes), or it failed."""
        for task in [t for t in self._claims if t.phase not in (Phase.LOADING, Phase.COMPUTING)]:
            hashes = self._claims.pop(task)
            if self.publish is not None:
                self.publish[1](hashes)

    # ---------------------------------------------------------------------------- pool pressure
    def _may_admit(self, task: PrefillTask, tasks: Iterable[PrefillTask], now: float) -> bool:
        """Whether the head of the queue may take its pages now.

        NOTE (the L1 a prompt leaves free): when the free pages cannot hold the prompt, admitting it
        evicts cached pages. Admitted while another task still computes, it would evict the pages
        of the conversations queued behind it (the L1 would hold two prompts, and none of what the
        store dropped); admitted once that task is done and written back, it takes that task's
        pages, in the store by then, first. So while another task holds pages it waits: without
        bound while that task computes (compute is serial anyway: it would wait for the forward),
        and at most prefill.persist_wait_s for the others' I/O (store loads and writes, the push: a
        stalled store must not stall admission)."""
        alloc, page_size = self._rt.allocator, self._rt.page_size
        if alloc.num_free() >= pages_for(task.prompt_len, page_size) or not self._prefix_cache:
            return True
        others = [t for t in tasks if t is not task and t.page_ids]
        if not others:
            self._paced = None
            return True
        if any(t.phase is Phase.COMPUTING for t in others):
            return False  # woken again when that task's forward ends
        if self._paced is None or self._paced[0] is not task:
            self._paced = (task, now)
            self._persist.metrics.paced.inc()
        since = self._paced[1]
        if now - since >= self._persist_wait_s:
            return True
        self._wake_at(since + self._persist_wait_s)
        return False

    def _under_pressure(self, task: PrefillTask, now: float, patient: bool) -> None:
        """The head of the queue lacks pages. Writing a page to the store costs ~1 ms, recomputing it
        later tens of ms, so first wait (bounded) for writes, and write out the unpersisted pages
        that would otherwise be dropped; past the bound, cancel queued writes (counted) and let
        admission drop unpersisted pages (counted by reason)."""
        if self._pressure_since is None:
            self._pressure_since = now
            self._persist.metrics.pressure_waits.inc()
        if patient:
            self._persist.write_before_evict(task.prefix.pages_short)
        elif (self._persist.usable and self._rt.store_io is not None
              and now - self._last_cancel >= self._persist_wait_s):
            # NOTE: admission now allows loss until it succeeds. Only saves queued longer than the
            # bound are cancelled: a pool full of running requests is no reason to drop writes that
            # move (they finish in milliseconds), only a stalled store is.
            self._rt.store_io.cancel_saves(min_age_s=self._persist_wait_s)
            self._persist.metrics.cancelled.inc()
            self._last_cancel = now
