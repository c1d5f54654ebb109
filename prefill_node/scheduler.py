"""The prefill scheduler: one thread that owns the page allocator and the model runner.

Each iteration of its SchedulerLoop (pdorch/worker/loop.py; never spinning, never blocking on I/O,
woken by new messages and by store I/O completions):
  1. take the messages (prefill_node/messages.py: new tasks, aborts, push results, evicted keys;
     calls such as flush / integrity checks),
  2. take store I/O completions (loads into our pages, writes from them),
  3. fail tasks whose deadline passed or that were aborted,
  4. admit waiting tasks: L1 lookup, allocate the rest, one store load of every page L1 lacks;
     under pool pressure wait (at most `persist_wait_s`) for writes of L1 pages rather than drop
     pages the store lacks (persistence.py); stop waiting for the store loads the prefetch policy
     gives up on (prefetch.py: they are computed in fresh pages instead),
  5. run ONE forward over up to `chunk_tokens` prompt tokens taken FIFO across computing tasks
     (step.py: chunked prefill batched across requests; a task's holes and tail are separate
     chunks of the same forward), sample first tokens of tasks that completed, queue their
     write-back and start their push phase (push_phase.py: the transfer runs on the pusher's
     threads, not here; its completion goes back to push_phase.py, which owns PUSHING and DONE).

A task's pages go back once it is answered and holds no I/O lease (leases.py): each store load,
store save, read from D and push takes one when submitted and gives it back when it completes.

NOTE: only this thread touches the allocator; other threads talk to it through the inbox.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TypeVar

from prometheus_client import Counter

from engine.page_allocator import pages_for
from pdorch.config import PrefillConfig
from pdorch.worker.errors import Aborted, DeadlineExceeded, InvalidRequest, WorkerError
from pdorch.worker.loop import Evicted, SchedulerLoop
from pdorch.worker.metrics import WorkerRecorder
from pdorch.worker.status import WorkerLoad
from prefill_node import prefix, spans
from prefill_node.inflight import InFlight, InFlightMetrics
from prefill_node.leases import DECODE_READ
from prefill_node.messages import Abort, Cancel, EvictSaved, PrefixLoaded, Pushed, Read, Submit, TaskSaved
from prefill_node.persistence import Persister, PersistMetrics
from prefill_node.prefetch import Prefetch, PrefetchMetrics
from prefill_node.push_phase import PushPhase
from prefill_node.pusher import KVPusher
from prefill_node.step import PrefillStep
from prefill_node.task import Phase, PrefillTask
from store_client.config import StoreConfig

if TYPE_CHECKING:
    from pdorch.worker.runtime import WorkerRuntime
    from store_client.io_thread import IOCompletion

T = TypeVar("T")


class PrefillScheduler:
    def __init__(self, rt: WorkerRuntime, cfg: PrefillConfig, store: StoreConfig, pusher: KVPusher,
                 recorder: WorkerRecorder):
        self._rt = rt
        self._step = PrefillStep(rt, cfg.chunk_tokens)
        self._prefix_cache = cfg.prefix_cache
        self._persist = Persister(rt, cfg, store, PersistMetrics(recorder.registry))
        self._persist_wait_s = cfg.persist_wait_s
        self._prefetch = Prefetch(rt, cfg, PrefetchMetrics(recorder.registry))
        self._inflight = InFlight(rt, InFlightMetrics(recorder.registry), cfg.share_inflight_prefix and cfg.prefix_cache)
        self._pressure_since: float | None = None  # when the head of the queue first lacked pages
        # (task, since): the head of the queue waiting since then for another task's I/O (_may_admit)
        self._paced: tuple[PrefillTask, float] | None = None
        self._last_cancel = float("-inf")  # when queued writes were last cancelled under pressure
        self._pusher = pusher
        self._rec = recorder
        self._waiting: collections.deque[PrefillTask] = collections.deque()
        # Every task still holding state, in arrival order (an ordered set: tasks hash by identity).
        # NOTE: not keyed by request id: a retried id may arrive while the old task still waits for
        # its write-back to finish.
        self._tasks: dict[PrefillTask, None] = {}
        self._loop = SchedulerLoop("prefill", self._iterate, self._on_message, self._fail_all,
                                   rt.store_io, self._on_completion, rt.thread_init)
        self._push = PushPhase(rt, pusher, recorder, self._loop.post)
        self.load = WorkerLoad(0, 0, rt.allocator.num_available(), 0)
        self._decode_pool_pages = Counter("pdorch_prefill_decode_pool_pages", "Prefix pages read from the decode "
                                          "worker's pool (its prefix cache held them; this L1 did not), by outcome "
                                          "(failed: computed here instead)", ["outcome"], registry=recorder.registry)
        for outcome in ("read", "failed"):
            self._decode_pool_pages.labels(outcome)

    # ---------------------------------------------------------------- called from other threads
    def start(self) -> None:
        self._loop.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._loop.stop(timeout_s)

    def submit(self, task: PrefillTask) -> None:
        self._loop.post(Submit(task))

    def abort(self, request_id: str) -> None:
        self._loop.post(Abort(request_id))

    def cancel(self, task: PrefillTask) -> None:
        """Abort this very task (its RPC ended), whatever other task shares its request id."""
        self._loop.post(Cancel(task))

    def call(self, fn: Callable[[], T], timeout_s: float = 30.0) -> T:
        """Run fn() on the scheduler thread (between forwards) and return its result."""
        return self._loop.call(fn, timeout_s)

    @property
    def persister(self) -> Persister:
        """Its store writes of L1 pages; scheduler thread only (through call())."""
        return self._persist

    def store_evicted(self, keys: Iterable[str]) -> None:
        """Called by the store evictor's thread: these keys left the store (see Persister.left_store)."""
        self._loop.post(Evicted(tuple(keys)))

    def store_lost(self, keys: Iterable[str]) -> None:
        """Called by the store connector's thread: a master leader switch lost these keys."""
        self._loop.post(Evicted(tuple(keys), lost=True))

    def publish_claims(self, claimed: Callable[[list[str]], None], released: Callable[[list[str]], None]) -> None:
        """Before start(): where claims of pages in flight go (the worker's KV event journal)."""
        self._inflight.publish = (claimed, released)

    # ------------------------------------------------------------------------- scheduler thread
    def tasks_with_id(self, request_id: str) -> list[PrefillTask]:
        """Every task of this id still holding state, answered ones included (scheduler thread only)."""
        return [task for task in self._tasks if task.request_id == request_id]

    def live_task(self, request_id: str) -> PrefillTask | None:
        """The unanswered task with this id (scheduler thread only)."""
        for task in self._tasks:
            if task.request_id == request_id and not task.finished_phase and not task.future.done():
                return task
        return None

    def _iterate(self, now: float) -> bool:
        index = self._rt.chain_index
        if index is not None:  # ended conversations leave L1 first, as they leave the store
            self._rt.allocator.stale_after = index.stale_after()
        self._reap(now)
        self._admit()
        self._prefetch.apply(self._tasks, time.monotonic(), self._loop.wake_at)
        worked = self._compute_step()
        self._publish_load()
        return worked

    def _fail_all(self, err: WorkerError) -> None:
        for task in list(self._tasks):
            task.fail(err)
            self._maybe_release(task)
        self._publish_load()

    def _on_message(self, msg: object) -> None:
        if isinstance(msg, Submit):
            task = msg.task
            if self.live_task(task.request_id) is not None:
                task.fail(InvalidRequest(f"request id {task.request_id!r} is already being prefilled"))
                return
            self._tasks[task] = None
            self._waiting.append(task)
        elif isinstance(msg, (Abort, Cancel)):
            target = self.live_task(msg.request_id) if isinstance(msg, Abort) else msg.task
            # NOTE: the future may already hold the answer while the phase still says PUSHING
            # (the pusher answers first); an abort then is a no-op, like for unknown ids.
            if target is not None and not target.finished_phase and not target.future.done():
                target.fail(Aborted(f"request {target.request_id} aborted"))
                self._rec.request_failed(aborted=True)
                self._maybe_release(target)
        elif isinstance(msg, Evicted) and msg.lost:
            self._persist.rewrite_lost(list(msg.keys))
        elif isinstance(msg, Evicted):
            self._persist.left_store(list(msg.keys))
        elif isinstance(msg, Read):
            task = msg.task
            task.io.give_back(DECODE_READ)
            n = len(task.prefix.reading)
            self._decode_pool_pages.labels("failed" if msg.error else "read").inc(n)
            if not task.finished_phase:
                prefix.on_loaded(task, self._rt, task.prefix.reading, [msg.error is None] * n, self._prefix_cache,
                                 from_decode=True)
            self._maybe_release(task)
        elif isinstance(msg, Pushed):  # the push phase's completion (prefill_node/push_phase.py)
            self._push.pushed(msg)
            self._maybe_release(msg.task)
        else:
            raise TypeError(f"prefill scheduler: unknown message {msg!r}")

    def _on_completion(self, done: IOCompletion) -> None:
        tag = done.tag
        if isinstance(tag, PrefixLoaded):
            if tag.task.load.late:  # the task gave up on this load (prefetch.py): only its old pages wait for it
                self._prefetch.settle_late(tag.task, done.page_ok)
                return
            self._prefetch.completed(tag.task)
            if prefix.store_loaded(tag.task, self._rt, done, self._prefix_cache):  # its lease back (prefix.py)
                self._rec.count_store_loaded(done.pages_ok)
        else:  # a store write of L1 pages: its lease or its retained pages go back there (persistence.py)
            self._rec.count_written_by_reason(self._persist.on_saved(done))
            self._rec.count_store_written(done.pages_ok, kind="writeback")
            if isinstance(tag, EvictSaved):
                return
            if not isinstance(tag, TaskSaved):
                raise TypeError(f"prefill scheduler: unknown store write tag {tag!r}")
            spans.written(tag.task, done, self._rt.pool.page_nbytes)
        self._maybe_release(tag.task)

    def _reap(self, now: float) -> None:
        for task in list(self._tasks):
            # NOTE: a PUSHING task whose future is done was already answered by the pusher.
            if not task.finished_phase and not task.future.done():
                self._loop.wake_at(task.deadline)  # no later than its deadline, however idle
            if not task.finished_phase and not task.future.done() and now > task.deadline:
                task.fail(DeadlineExceeded(
                    f"prefill of {task.request_id} missed its deadline ({task.job.timeout_s:.1f}s) "
                    f"in phase {task.phase.value}"))
                self._rec.request_failed(aborted=False)
            self._maybe_release(task)

    def _maybe_release(self, task: PrefillTask) -> None:
        """Give the pages back once the task is answered and no I/O touches them any more."""
        if task.finished_phase:
            self._inflight.release(task)  # done or failed: no claim outlives its task
        if not task.finished_phase or len(task.io) > 0:
            return
        if task.page_ids:
            self._rt.allocator.release(task.page_ids)
            task.page_ids = []
        self._tasks.pop(task, None)
        if task in self._waiting:
            self._waiting.remove(task)
        self._inflight.remove(task)

    def _admit(self) -> None:
        ready = self._inflight.ready(self._tasks, time.monotonic())
        if ready:  # their wait for pages in flight is over: back in the queue, by arrival
            self._waiting = collections.deque(sorted([*ready, *self._waiting], key=lambda t: t.created))
        while self._waiting:
            task = self._waiting[0]
            if not task.finished_phase:
                now = time.monotonic()
                if not task.inflight.waited_for and self._inflight.park(task, self._tasks, now):
                    self._waiting.popleft()
                    continue  # parked: the tasks behind it go on (prefill_node/inflight.py)
                if not self._may_admit(task, now):
                    return  # the task before it still holds its pages (see _may_admit)
                patient = self._persist.usable and self._prefix_cache and (
                    self._pressure_since is None or now - self._pressure_since < self._persist_wait_s)
                task.admitted = now
                if not prefix.admit(task, self._rt, self._prefix_cache, allow_loss=not patient):
                    self._under_pressure(task, now, patient)
                    return  # wait for pages to come back (the deadline still applies)
                spans.queued(task)
                self._pressure_since = None
                self._inflight.metrics.pages.inc(task.prefix.inflight_pages)
                self._inflight.claim(task)
                if task.prefix.loading:
                    self._prefetch.started(task, now)
                if task.prefix.reading:
                    self._read_from_decode(task)
            self._waiting.popleft()

    def _may_admit(self, task: PrefillTask, now: float) -> bool:
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
        others = [t for t in self._tasks if t is not task and t.page_ids]
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
        self._loop.wake_at(since + self._persist_wait_s)
        return False

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
        """Pusher thread: the read from D's pool is over; the scheduler takes it from here."""
        try:
            spans.decode_read(task, err, nbytes, seconds, len(task.prefix.reading))
        finally:
            self._loop.post(Read(task, err))

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

    def _compute_step(self) -> bool:
        finished = self._step.run(self._tasks)
        if finished is None:
            return False
        stepped, tokens, seconds = self._step.last
        self._inflight.observe(tokens, seconds)
        for task in stepped:  # pages complete now join L1 at once: requests parked for them go on
            self._persist.cache_computed(task)
        for task in finished:
            self._finish_compute(task)
        return True

    def _finish_compute(self, task: PrefillTask) -> None:
        """The task's first token is sampled: queue its write-back, then push its pages to D."""
        page_size = self._rt.page_size
        self._rec.prompt_tokens(computed=task.computed_tokens(page_size), cached=task.cached(page_size))
        given_up = task.load.given_up_pages  # pages of a store load given up on: computed, not holes
        self._persist.metrics.holes.inc(len(task.prefix.holes) - given_up)
        self._persist.save_task_pages(task)  # holds the task's pages until the store has them
        self._inflight.release(task)  # its pages are in L1 now: the claim ends
        spans.computed(task, page_size)
        self._push.start(task)

    def _publish_load(self) -> None:
        alloc = self._rt.allocator
        self._persist.metrics.sync(alloc)
        free = alloc.num_available()
        active = alloc.num_total - free  # referenced pages: neither free nor evictable
        queued = len(self._waiting) + len(self._inflight)
        self.load = WorkerLoad(queued=queued, running=len(self._tasks) - queued,
                                 free_pages=free, active_pages=active)

