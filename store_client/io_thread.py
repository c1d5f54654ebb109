"""StoreIO: store loads and saves run on dedicated I/O threads; the scheduler submits and polls.

    scheduler thread                      I/O thread(s)
    submit_load(tag, keys, addrs) --> [loads] --\\
    submit_save(tag, keys, addrs) --> [saves] ---+--> KVStore.load / .save (GIL released in Mooncake)
    poll() <-- [completions] <-------------------/
    on_complete() ----> wakes the scheduler (no polling interval: it sleeps until work or a completion)

Every submit produces exactly one IOCompletion, delivered by poll(), even when the op was
dropped, cancelled or never ran, so the caller can always release the pages it retained.

Why saves never delay loads nor hold pages a later request needs:
- Loads first: an idle I/O thread always takes a queued load before any save. With io_threads >= 2
  thread 0 serves loads only, so a load never waits behind a save at all.
- Saves run in chunks of `save_chunk_pages`: with one thread a load waits at most one chunk
  (16 SmolLM2 pages = 11.8 MB, ~5 ms at 2 GB/s), never a whole request's write-back.
- The caller retains a save's pages until its completion (they must not be overwritten while
  Mooncake reads them). To bound what that pins, queued save pages are capped at
  `max_pending_save_pages`: a save submitted while the queue holds that many completes at once as
  "dropped" (the pages stay valid in L1, marked unpersisted with that reason, so the caller can write
  them again later). Below it a save is taken whole, even one that takes the queue past it: NOTE: a
  save larger than the cap was dropped even on an empty queue before, so a prompt of more pages than
  the cap (4096 tokens at the defaults) never reached the store by its write-through. Past a bounded wait under page pressure the scheduler calls `cancel_saves()`:
  queued saves complete as "cancelled" and their pages come back within one poll.
  `cancel_owner()` drops one owner's queued pages from shared saves (a decode step's batch).
- Loads and saves carry a deadline; a load still queued when it passes completes as "timeout"
  without running (the request recomputes instead of waiting), and so do a save's queued pages.
- Completions say, per page, whether it was loaded / is now in the store (`page_ok`).

Why it keeps Mooncake's bandwidth while the scheduler loop holds the GIL: each return from a
Mooncake call must re-take the GIL, which a CPU-bound scheduler thread gives up only every
switch interval (5 ms), longer when the OS has it descheduled. So (a) loads queued together go
out as ONE batch_get_into (up to LOAD_BATCH_MAX_BYTES), one GIL trip per batch, not per request;
(b) with io_threads >= 2 one thread's batch is moving bytes while another waits for the GIL.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from store_client.results import DISABLED, OK, RPC_FAILED, TIMEOUT, check_pairs
from store_client.store import KVStore

log = logging.getLogger(__name__)

LOAD = "load"
SAVE = "save"
DROPPED = "dropped"
CANCELLED = "cancelled"
# Coalescing cap: bigger batches amortize the GIL trip, but every request in a batch completes
# when the whole batch does, so keep a batch to tens of milliseconds of transfer.
LOAD_BATCH_MAX_BYTES = 64 << 20


@dataclass(frozen=True)
class IOCompletion:
    tag: object
    op: str  # LOAD or SAVE
    pages_ok: int  # load: pages now in the pool; save: pages now in the store (written + skipped)
    reason: str  # "ok", a miss reason of store.py, or DROPPED / CANCELLED / TIMEOUT for saves
    num_pages: int = 0
    pages_skipped: int = 0  # save: already present, not rewritten
    elapsed_s: float = 0.0  # submit -> completion
    page_ok: tuple[bool, ...] = ()  # per page of the submission (after cancel_owner removals)
    page_ssd: tuple[bool, ...] = ()  # load: per page, read from the store's SSD tier; () = none was
    miss_reasons: tuple[str, ...] = ()  # load: per page not loaded, why (results.py); () = all `reason`


@dataclass(eq=False)  # identity: jobs are found in and removed from queues by object
class _Job:
    tag: object
    op: str
    keys: list[str]
    addrs: list[int]
    submitted: float
    deadline: float = float("inf")
    owners: list | None = None  # save: who each page belongs to (cancel_owner), or None
    cursor: int = 0  # save: next page to hand to a thread
    running: int = 0  # save: chunks on threads now
    page_ok: list[bool] = field(default_factory=list)
    skipped: int = 0
    reason: str = OK
    aborted: bool = field(default=False)  # save: stop handing out chunks (failure, cancel)


class StoreIO:
    """`on_complete`, when set, is called after every completion is queued (on an I/O thread, or on
    the submitting thread for ops that complete at once); it must only wake the caller, never block."""

    def __init__(self, store: KVStore, on_complete: Callable[[], None] | None = None,
                 thread_init: Callable[[], None] | None = None):
        cfg = store.cfg
        self.store = store
        self._chunk = cfg.save_chunk_pages
        self._load_batch_pages = max(1, LOAD_BATCH_MAX_BYTES // store.page_nbytes)
        self._max_save_pages = cfg.max_pending_save_pages
        self._op_timeout_s = cfg.op_timeout_s
        self._metrics = store.metrics
        self._cv = threading.Condition()
        self._loads: deque[_Job] = deque()
        self._saves: deque[_Job] = deque()
        self._pending_save_pages = 0  # pages of save chunks queued or running (what we pin)
        self._open = {LOAD: 0, SAVE: 0}  # accepted submissions not yet completed
        self._done: deque[IOCompletion] = deque()
        self._done_cv = threading.Condition()
        self._closed = False
        self.on_complete = on_complete
        # Told the keys every save put in the store (written, or found there already), on the thread
        # that completes it, before the completion is delivered: the worker's KV events. None: off.
        self.on_saved: Callable[[list[str]], None] | None = None
        # What each I/O thread runs first: the worker's GPU made current, where pages are device memory
        # (a thread starts on GPU 0; this module stays torch-free, the worker passes it in).
        self._thread_init = thread_init
        self._threads = [threading.Thread(target=self._worker, args=(i == 0 and cfg.io_threads > 1,),
                                          name=f"store-io-{i}", daemon=True) for i in range(cfg.io_threads)]
        for t in self._threads:
            t.start()

    # ------------------------------------------------------------------ scheduler side
    def submit_load(self, tag: object, keys: Sequence[str], addrs: Sequence[int],
                    deadline_s: float | None = None) -> None:
        """Queue a load of pages into pool addresses (the caller retains them until the completion)."""
        check_pairs(keys, addrs)
        now = time.monotonic()
        job = _Job(tag, LOAD, list(keys), list(addrs), now,
                   deadline=now + (self._op_timeout_s if deadline_s is None else deadline_s))
        with self._cv:
            if self._closed:
                self._complete(job, DISABLED)
                return
            self._loads.append(job)
            self._open[LOAD] += 1
            # Any thread serves loads: wake one (each woken thread costs a GIL hand-off).
            self._cv.notify()
        self._publish_depth()

    def submit_save(self, tag: object, keys: Sequence[str], addrs: Sequence[int],
                    owners: Sequence[object] | None = None) -> bool:
        """Queue a write-back; False when it was dropped (its completion still arrives via poll).

        `owners` (one per page) lets cancel_owner() take one owner's pages out of a shared save.
        Pages still queued `op_timeout_s` after submission are dropped as "timeout".
        """
        check_pairs(keys, addrs)
        if owners is not None and len(owners) != len(keys):
            raise ValueError(f"got {len(keys)} keys but {len(owners)} owners")
        now = time.monotonic()
        job = _Job(tag, SAVE, list(keys), list(addrs), now, deadline=now + self._op_timeout_s,
                   owners=None if owners is None else list(owners), page_ok=[False] * len(keys))
        with self._cv:
            reason = DISABLED if self._closed else None
            if reason is None and self._pending_save_pages >= self._max_save_pages:
                reason = DROPPED
            if reason is None:
                self._pending_save_pages += len(keys)
                self._saves.append(job)
                self._open[SAVE] += 1
                self._cv.notify_all()  # NOTE: notify() could wake only the loads-only thread
        if reason is not None:
            self._metrics.saves_dropped.labels(reason).inc(len(keys))
            self._complete(job, reason)
            return False
        self._publish_depth()
        return True

    def cancel_saves(self, tags: Collection[object] | None = None, min_age_s: float = 0.0) -> int:
        """Drop queued (not yet running) save chunks, of all saves or those whose tag is in `tags`,
        submitted at least `min_age_s` ago (a save that old is stalled, not just queued).

        Returns the pages cancelled. Chunks already running finish (within one chunk's time).
        """
        cancelled = 0
        now = time.monotonic()
        with self._cv:
            for job in list(self._saves):
                if (tags is None or job.tag in tags) and now - job.submitted >= min_age_s:
                    cancelled += self._drop_rest(job, CANCELLED)
        self._publish_depth()
        return cancelled

    def cancel_owner(self, owner: object) -> int:
        """Take `owner`'s queued (not yet running) pages out of every save; returns the pages dropped.

        The saves themselves go on for their other owners; their completions arrive as usual.
        """
        dropped = 0
        with self._cv:
            for job in list(self._saves):
                if job.owners is None:
                    continue
                keep = [i for i in range(job.cursor, len(job.keys)) if job.owners[i] is not owner]
                n = len(job.keys) - job.cursor - len(keep)
                if n == 0:
                    continue
                for name in ("keys", "addrs", "owners", "page_ok"):
                    seq = getattr(job, name)
                    setattr(job, name, seq[:job.cursor] + [seq[i] for i in keep])
                dropped += n
                self._pending_save_pages -= n
                if job.cursor >= len(job.keys):
                    self._saves.remove(job)
                    if job.running == 0:
                        self._open[SAVE] -= 1
                        self._complete(job, job.reason)
        if dropped:
            self._metrics.saves_dropped.labels(CANCELLED).inc(dropped)
        self._publish_depth()
        return dropped

    def _drop_rest(self, job: _Job, reason: str) -> int:
        """(lock held) Drop a queued save's pages not yet handed out; complete it if nothing runs."""
        n = len(job.keys) - job.cursor
        self._pending_save_pages -= n
        job.cursor = len(job.keys)
        job.aborted = True
        if job.reason == OK:
            job.reason = reason
        if job in self._saves:
            self._saves.remove(job)
        if n:
            self._metrics.saves_dropped.labels(reason).inc(n)
        if job.running == 0:
            self._open[SAVE] -= 1
            self._complete(job, job.reason)
        return n

    def poll(self, timeout_s: float = 0.0) -> list[IOCompletion]:
        """Completions so far. Non-blocking by default; timeout_s > 0 waits for at least one."""
        with self._done_cv:
            if not self._done and timeout_s > 0:
                self._done_cv.wait(timeout_s)
            out = list(self._done)
            self._done.clear()
        return out

    @property
    def queue_depth(self) -> int:
        """Loads and saves queued or running."""
        with self._cv:
            return self._open[LOAD] + self._open[SAVE]

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop taking work: queued loads complete as disabled, queued saves as cancelled; join threads."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
            loads, self._loads = list(self._loads), deque()
            self._open[LOAD] -= len(loads)
            self._cv.notify_all()
        for job in loads:
            self._complete(job, DISABLED)
        self.cancel_saves()
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                log.warning("%s still running a store op after %.0fs", t.name, timeout_s)

    # ------------------------------------------------------------------ I/O threads
    def _worker(self, loads_only: bool) -> None:
        if self._thread_init is not None:
            self._thread_init()
        while True:
            with self._cv:
                while not self._loads and (loads_only or not self._saves) and not self._closed:
                    self._cv.wait()
                if self._loads:
                    jobs = [self._loads.popleft()]
                    pages = len(jobs[0].keys)
                    while self._loads and pages + len(self._loads[0].keys) <= self._load_batch_pages:
                        jobs.append(self._loads.popleft())
                        pages += len(jobs[-1].keys)
                    job = None
                elif self._saves and not loads_only and time.monotonic() > self._saves[0].deadline:
                    self._drop_rest(self._saves[0], TIMEOUT)  # queued past its deadline: give the pages back
                    continue
                elif self._saves and not loads_only:
                    job = self._saves[0]
                    lo, hi = job.cursor, min(job.cursor + self._chunk, len(job.keys))
                    job.cursor = hi
                    job.running += 1
                    if job.cursor >= len(job.keys):
                        self._saves.popleft()
                else:
                    return  # closed and nothing left for this thread
            self._publish_depth()
            if job is None:
                self._run_loads(jobs)
            else:
                self._run_save(job, lo, hi)

    def _run_loads(self, jobs: list[_Job]) -> None:
        now = time.monotonic()
        late = [j for j in jobs if now > j.deadline]
        live = [j for j in jobs if now <= j.deadline]
        results = self.store.load_many([(j.keys, j.addrs) for j in live]) if live else []
        with self._cv:
            self._open[LOAD] -= len(jobs)
        for job in late:
            self._metrics.misses.labels(LOAD, TIMEOUT).inc(len(job.keys))
            self._complete(job, TIMEOUT)
        for job, result in zip(live, results):
            self._complete(job, result.reason, result.page_ok, result.page_ssd, result.miss_reasons)
        self._publish_depth()

    def _run_save(self, job: _Job, lo: int, hi: int) -> None:
        result = None
        if not job.aborted:
            result = self.store.save(job.keys[lo:hi], job.addrs[lo:hi])
        dropped = False
        with self._cv:
            self._pending_save_pages -= hi - lo
            job.running -= 1
            if result is not None:
                job.page_ok[lo:hi] = result.page_ok or [False] * (hi - lo)
                job.skipped += result.pages_skipped
                if result.reason != OK and job.reason == OK:
                    job.reason = result.reason
                if result.reason in (DISABLED, RPC_FAILED) and job in self._saves:
                    # The store is gone: the rest of this save cannot succeed; free its pages now.
                    self._drop_rest(job, result.reason)
                    dropped = True  # completed (or will be by its last running chunk)
            finished = not dropped and job.running == 0 and job.cursor >= len(job.keys)
            if finished:
                self._open[SAVE] -= 1
        if finished:
            self._complete(job, job.reason)
        self._publish_depth()

    # ------------------------------------------------------------------ helpers
    def _complete(self, job: _Job, reason: str, page_ok: Sequence[bool] | None = None, page_ssd: Sequence[bool] = (),
                  miss_reasons: Sequence[str] = ()) -> None:
        """Deliver the job's completion; `page_ok` defaults to the job's own (a save's chunks so far)."""
        page_ok = tuple(job.page_ok if page_ok is None else page_ok) or (False,) * len(job.keys)
        done = IOCompletion(job.tag, job.op, sum(page_ok), reason, len(job.keys), job.skipped,
                            time.monotonic() - job.submitted, page_ok, tuple(page_ssd), tuple(miss_reasons))
        saved = self.on_saved
        if saved is not None and job.op == SAVE and done.pages_ok:
            saved([k for k, good in zip(job.keys, page_ok) if good])
        with self._done_cv:
            self._done.append(done)
            self._done_cv.notify_all()
        wake = self.on_complete
        if wake is not None:
            wake()

    def _publish_depth(self) -> None:
        with self._cv:
            loads, saves = self._open[LOAD], self._open[SAVE]
        self._metrics.queue_depth.labels(LOAD).set(loads)
        self._metrics.queue_depth.labels(SAVE).set(saves)

