"""The prefill scheduler: one thread that owns the page allocator and the model runner.

Each iteration of its SchedulerLoop (pdorch/worker/loop.py; never spinning, never blocking on I/O,
woken by new messages and by store I/O completions):
  1. take the messages (prefill_node/messages.py: new tasks, aborts, evicted keys; calls such as
     flush / integrity checks) and the completions, each routed to the module that owns it:
       PrefixLoaded (store load), Read (read from D's pool)  -> admission.py
       TaskSaved, EvictSaved (store writes)                   -> persistence.py
       Pushed (the push into D's pages)                       -> push_phase.py
  2. fail tasks whose deadline passed; give back the pages of every task that is answered and holds
     no I/O lease (leases.py: each module takes and gives back the leases of the I/O it starts),
  3. admission (admission.py): in-flight sharing, pool pressure, the L1 lookup, the store load,
     the prefetch policy; it moves tasks to COMPUTING,
  4. run ONE forward over up to `chunk_tokens` prompt tokens taken FIFO across computing tasks
     (step.py: chunked prefill batched across requests), then for each task whose first token it
     sampled: one call to persistence.py (its write-back) and one to push_phase.py (the transfer
     runs on the pusher's threads, not here).

NOTE: only this thread touches the allocator; other threads talk to it through the inbox (`post`, `call`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TypeVar

from pdorch.config import PrefillConfig
from pdorch.worker.errors import Aborted, DeadlineExceeded, InvalidRequest, WorkerError
from pdorch.worker.loop import Evicted, SchedulerLoop
from pdorch.worker.metrics import WorkerRecorder
from pdorch.worker.status import WorkerLoad
from prefill_node import spans
from prefill_node.admission import PrefillAdmission
from prefill_node.messages import Abort, Cancel, PrefixLoaded, Pushed, Read, Submit
from prefill_node.persistence import Persister, PersistMetrics
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
        self._step = PrefillStep(rt, cfg.chunk_tokens, cfg.prefix_cache)
        self._persist = Persister(rt, cfg, store, PersistMetrics(recorder.registry), recorder)
        self._rec = recorder
        # Every task still holding state, in arrival order (an ordered set: tasks hash by identity).
        # NOTE: not keyed by request id: a retried id may arrive while the old task still waits for
        # its write-back to finish.
        self._tasks: dict[PrefillTask, None] = {}
        self._loop = SchedulerLoop("prefill", self._iterate, self._on_message, self._fail_all,
                                   rt.store_io, self._on_completion, rt.thread_init)
        self._admission = PrefillAdmission(rt, cfg, self._persist, self._step, pusher, self._loop, recorder)
        self._push = PushPhase(rt, pusher, recorder, self._loop.post)
        # Where other threads hand it a new task (`Submit`) or the end of one (`Abort`, `Cancel`): the
        # loop's inbox itself, no layer between.
        self.post: Callable[[Submit | Abort | Cancel], None] = self._loop.post
        self.load = WorkerLoad(0, 0, rt.allocator.num_available(), 0)

    # ---------------------------------------------------------------- called from other threads
    def start(self) -> None:
        self._loop.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._loop.stop(timeout_s)

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
        self._admission.publish = (claimed, released)

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
        self._release_done()
        self._admission.admit(self._tasks)
        worked = self._compute_step()
        self._publish_load()
        return worked

    def _fail_all(self, err: WorkerError) -> None:
        for task in list(self._tasks):
            task.fail(err)
        self._release_done()
        self._publish_load()

    def _on_message(self, msg: object) -> None:
        if isinstance(msg, Submit):
            task = msg.task
            if self.live_task(task.request_id) is not None:
                task.fail(InvalidRequest(f"request id {task.request_id!r} is already being prefilled"))
                return
            self._tasks[task] = None
        elif isinstance(msg, (Abort, Cancel)):
            target = self.live_task(msg.request_id) if isinstance(msg, Abort) else msg.task
            # NOTE: the future may already hold the answer while the phase still says PUSHING
            # (the pusher answers first); an abort then is a no-op, like for unknown ids.
            if target is not None and not target.finished_phase and not target.future.done():
                target.fail(Aborted(f"request {target.request_id} aborted"))
                self._rec.request_failed(aborted=True)
        elif isinstance(msg, Evicted) and msg.lost:
            self._persist.rewrite_lost(list(msg.keys))
        elif isinstance(msg, Evicted):
            self._persist.left_store(list(msg.keys))
        elif isinstance(msg, Read):  # the read from D's pool that admission started
            self._admission.read(msg)
        elif isinstance(msg, Pushed):  # the push phase's completion
            self._push.pushed(msg)
        else:
            raise TypeError(f"prefill scheduler: unknown message {msg!r}")

    def _on_completion(self, done: IOCompletion) -> None:
        """A store I/O completion, to the module that submitted it (by its tag)."""
        if isinstance(done.tag, PrefixLoaded):
            self._admission.loaded(done)
        else:  # TaskSaved, EvictSaved (persistence.py raises on any other tag)
            self._persist.on_saved(done)

    def _reap(self, now: float) -> None:
        for task in self._tasks:
            # NOTE: a PUSHING task whose future is done was already answered by the pusher.
            if task.finished_phase or task.future.done():
                continue
            self._loop.wake_at(task.deadline)  # no later than its deadline, however idle
            if now > task.deadline:
                task.fail(DeadlineExceeded(
                    f"prefill of {task.request_id} missed its deadline ({task.job.timeout_s:.1f}s) "
                    f"in phase {task.phase.value}"))
                self._rec.request_failed(aborted=False)

    def _release_done(self) -> None:
        """Give the pages back of every task that is answered and that no I/O touches any more."""
        for task in [t for t in self._tasks if t.finished_phase and len(t.io) == 0]:
            if task.page_ids:
                self._rt.allocator.release(task.page_ids)
                task.page_ids = []
            del self._tasks[task]

    def _compute_step(self) -> bool:
        finished = self._step.run(self._tasks)
        if finished is None:
            return False
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
        spans.computed(task, page_size)
        self._push.start(task)

    def _publish_load(self) -> None:
        alloc = self._rt.allocator
        self._persist.metrics.sync(alloc)
        free = alloc.num_available()
        active = alloc.num_total - free  # referenced pages: neither free nor evictable
        queued = sum(1 for t in self._tasks if t.phase is Phase.WAITING)  # parked ones included
        self.load = WorkerLoad(queued=queued, running=len(self._tasks) - queued,
                               free_pages=free, active_pages=active)
