"""Keeping L1 pages in the store: write-back, backfill, write-before-evict (no self-made holes).

docs/design.md section 4: a page leaves L1 only once the store holds it, or with a counted reason.
Which pages are written when is `store.write_policy` (write_policy.py): write_through writes what
the request computed with its write-back; write_through_selective only pages used often enough;
write_back nothing at compute time, every page by write-before-evict.

    computed here ----write-back----\\
    L1 hit, store lacks it --backfill-+--> one submit_save per request --> completion:
    evictable, store lacks it,        |     ok    -> allocator.mark_persisted
      pool short of pages --write-----/     other -> allocator.mark_unpersisted(reason)
      before evict (pages retained until written)

The allocator hands out persisted pages before unpersisted ones, so an unpersisted page is only
dropped when nothing else is left: then its reason ("cancelled", "dropped", "timeout", "no_space",
"store_disabled", ...) is counted in `pdorch_prefill_l1_dropped_unpersisted_pages_total`.

Owns `task.persist` (PersistState, prefill_node/task.py) and a task's STORE_SAVE lease (taken when
its write-back is queued, given back by its completion, `on_saved`, which also releases the pages a
write-before-evict retained). The scheduler calls it once a task's first token is sampled
(`save_task_pages`) and routes every save completion here by its tag (TaskSaved, EvictSaved).
Runs on the scheduler thread only (it touches the allocator).
"""

from __future__ import annotations

import collections
from functools import partial
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge

from engine.page_allocator import LEFT_STORE as STORE_EVICTED  # the store dropped it on purpose
from engine.page_allocator import PENDING, UNWRITTEN
from pdorch.config import PrefillConfig
from pdorch.worker.drain_writes import DrainWrites, WriteBackProgress, chunk_pages_for, still_unstored
from pdorch.worker.restore_backlog import LOST, RestoreBacklog, still_lost
from prefill_node import spans
from prefill_node.leases import STORE_SAVE
from prefill_node.messages import EvictSaved, TaskSaved
from prefill_node.write_policy import DEFERRED, WritePolicy
from store_client.config import StoreConfig
from store_client.page_hash import store_key

if TYPE_CHECKING:
    from pdorch.worker.metrics import WorkerRecorder
    from store_client.io_thread import IOCompletion


def needs_write(alloc, page: int) -> bool:
    """A cached page the store lacks that nobody is writing, that the store did not drop on purpose,
    and whose write the write policy does not put off (to its eviction, or to its next uses)."""
    return not alloc.is_persisted(page) and alloc.unpersisted_reason(page) not in (
        PENDING, STORE_EVICTED, DEFERRED, UNWRITTEN)


class PersistMetrics:
    def __init__(self, registry):
        p = "pdorch_prefill_"
        self.unpersisted = Gauge(p + "l1_unpersisted_pages", "L1 pages the store is not known to hold",
                                 registry=registry)
        self.dropped = Counter(p + "l1_dropped_unpersisted_pages", "L1 pages evicted while the store lacked "
                               "them, by why it lacked them", ["reason"], registry=registry)
        self.written = Counter(p + "l1_persist_pages", "L1 pages queued for a store write, by kind "
                               "(writeback = computed here, backfill = L1 hit the store lacked, selective = "
                               "at the use store.write_policy asked for, evict = written before eviction, drain = written back "
                               "as the worker drained)",
                               ["kind"], registry=registry)
        self.skipped = Counter(p + "store_writes_skipped_pages", "Computed pages not written: the store is "
                               "full and its chain eviction would remove them at once (they stay in L1)",
                               registry=registry)
        self.holes = Counter(p + "hole_pages_recomputed", "Reusable pages neither L1 nor the store had, "
                             "computed in place (the pages after them were still reused)", registry=registry)
        self.pressure_waits = Counter(p + "persist_waits", "Admissions that waited for store writes of L1 "
                                      "pages instead of dropping them", registry=registry)
        self.paced = Counter(p + "admissions_paced", "Admissions that waited for the task before them to "
                             "finish its store I/O (so as to take its pages, not those of queued "
                             "conversations)", registry=registry)
        self.cancelled = Counter(p + "persist_wait_expired", "Times prefill.persist_wait_s ran out under pool "
                                 "pressure and queued writes were cancelled", registry=registry)
        self._seen: dict[str, int] = {}
        for kind in ("writeback", "backfill", "selective", "evict", "restore", "drain"):
            self.written.labels(kind)

    def sync(self, alloc) -> None:
        """Export the allocator's counts (called once per scheduler iteration)."""
        self.unpersisted.set(alloc.num_unpersisted())
        for reason, n in alloc.evicted_unpersisted.items():
            if n != self._seen.get(reason, 0):
                self.dropped.labels(reason).inc(n - self._seen.get(reason, 0))
                self._seen[reason] = n


class Persister:
    """Submits the store writes of L1 pages and applies their completions to the allocator."""

    def __init__(self, rt, prefill: PrefillConfig, store: StoreConfig, metrics: PersistMetrics,
                 recorder: WorkerRecorder):
        self._rt, self._rec = rt, recorder
        self.enabled = store.write_back and rt.store_io is not None  # store.write_back and a store client
        self._prefix_cache = prefill.prefix_cache
        self.metrics = metrics
        self.policy = WritePolicy.of(store)
        # write_back: page hash -> its depth in its chain, for the write at eviction (the store
        # evictor ranks written pages by it). Entries of pages L1 no longer holds are pruned.
        self._deferred_depths: dict[str, int] = {}
        self._restore = RestoreBacklog()  # pages a leader switch lost, written again a few chunks at a time
        self._drain: DrainWrites | None = None  # the drain's write-back, a few chunks at a time
        self._drain_chunk_pages = chunk_pages_for(store.max_pending_save_pages)

    @property
    def usable(self) -> bool:
        return self.enabled and self._rt.store.enabled

    def save_task_pages(self, task) -> bool:
        """Cache the task's computed full pages in L1 and write them (plus its backfill, and the L1
        hits now used often enough) to the store in one save, as far as the write policy wants them
        now. True if a save was queued: the task holds its STORE_SAVE lease (its pages) until it completes."""
        queued = self._save_task_pages(task)
        if queued:
            task.io.take(STORE_SAVE)
        return queued

    def _save_task_pages(self, task) -> bool:
        alloc, hashes = self._rt.allocator, task.prefix.hashes
        computed = task.computed_full_pages(self._rt.page_size)
        pages = [task.page_ids[i] for i in computed]
        if not self._prefix_cache:  # no L1: write the pages, nothing to track
            if not (self.usable and pages):
                return False
            self.metrics.written.labels("writeback").inc(len(pages))
            keys = [store_key(self._rt.fingerprint, hashes[i]) for i in computed]
            self._rt.store_io.submit_save(TaskSaved(task, [], [], [], []), keys, self._rt.pool.page_addrs(pages))
            return True
        for i in computed:
            alloc.cache(hashes[i], task.page_ids[i])
        evictor = self._rt.evictor
        if evictor is not None and self.usable:
            below = {i for i in computed if not evictor.should_write(i, len(computed))}
            if below:  # deeper than what the store keeps now: L1 keeps them (as pages the store dropped)
                alloc.mark_left_store([task.page_ids[i] for i in below], STORE_EVICTED)
                task.persist.unstored = sorted(below)  # D's prefix cache is told too
                self.metrics.skipped.inc(len(below))
                computed = [i for i in computed if i not in below]
                pages = [task.page_ids[i] for i in computed]
        if not self.usable:
            alloc.mark_unpersisted(pages, "store_disabled" if self.enabled else "write_back_off")
            return False
        why = {i: "computed" for i in computed}
        why.update((i, "backfill") for i in task.prefix.backfill)
        why.update((i, "selective") for i in self.policy.due(alloc, task.page_ids[:len(hashes)]))
        now = [i for i in why if not self._hold(task, i, why[i])]
        # NOTE: D's prefix cache takes pushed pages as stored unless told (then it keeps them longer):
        # tell it every page whose write the policy puts off, L1 hits included.
        held = [i for i, page in enumerate(task.page_ids[:len(hashes)])
                if alloc.unpersisted_reason(page) in (DEFERRED, UNWRITTEN)]
        task.persist.unstored = sorted(set(task.persist.unstored) | set(held))
        for i in now:
            self.metrics.written.labels("writeback" if why[i] == "computed" else why[i]).inc()
        return self._submit(partial(TaskSaved, task), [task.page_ids[i] for i in now], now,
                            [why[i] for i in now])

    def _hold(self, task, i: int, why: str) -> bool:
        """Whether the policy puts off the write of the task's page i (marked with its reason then)."""
        alloc, page = self._rt.allocator, task.page_ids[i]
        reason = self.policy.hold(alloc, page, why)
        if reason is None:
            return False
        alloc.mark_unpersisted([page], reason)
        if reason == DEFERRED and alloc.page_hash(page) is not None:
            self._deferred_depths[alloc.page_hash(page)] = i  # a page's index is its depth in its chain
            if len(self._deferred_depths) > 2 * alloc.num_total:  # pages L1 dropped unwritten (flush, loss)
                self._deferred_depths = {h: d for h, d in self._deferred_depths.items() if alloc.pages_of([h])}
        return True

    def write_before_evict(self, n: int) -> int:
        """Retain up to n unpersisted evictable pages and write them; they are released (and become
        reclaimable without loss) when the write completes. Returns the pages submitted."""
        if not self.usable or n <= 0:
            return 0
        # NOTE: lru_unpersisted() never offers pages the store dropped on purpose, nor pages the
        # selective policy holds back (their own tiers), nor pages being written (retained): every
        # page it offers is one the store should hold before it leaves L1 (write_back: all of them).
        alloc = self._rt.allocator
        pages = alloc.lru_unpersisted(n)
        if not pages:
            return 0
        alloc.retain(pages)
        self.metrics.written.labels("evict").inc(len(pages))
        depths = [self._deferred_depths.pop(alloc.page_hash(p), None) for p in pages]
        self._submit(EvictSaved, pages, depths, ["evict"] * len(pages))
        return len(pages)

    def rewrite_lost(self, keys) -> None:
        """A master leader switch lost these keys (the new leader does not know them): write again
        the pages L1 still holds, retained until the store has them, as a write-before-evict, a few
        chunks at a time (pdorch/worker/restore_backlog.py: one submission of thousands would be
        dropped whole by the I/O queue's budget)."""
        alloc = self._rt.allocator
        pages = [p for p in alloc.pages_of([k.rpartition("/")[2] for k in keys])
                 if alloc.unpersisted_reason(p) != PENDING]
        alloc.mark_left_store(pages, LOST)  # not in the store now: L1 keeps them, write-before-evict writes them
        self._restore.add(alloc.page_hash(p) for p in pages)
        self._restore.pump(self._rewrite_chunk)

    def _rewrite_chunk(self, hashes: list[str]) -> bool:
        alloc = self._rt.allocator
        if not self.usable:
            self._restore.clear()  # the store is gone again: they stay lost (LOST)
            return False
        pages = still_lost(alloc, hashes)
        if not pages:
            return False
        self.metrics.written.labels("restore").inc(len(pages))
        return self._submit(EvictSaved, pages, [None] * len(pages), ["restore"] * len(pages))

    def write_back_unstored(self) -> int:
        """The worker drains: write every L1 page the store lacks (whatever the write policy held back;
        not the pages the store dropped on purpose, nor those being written), a few chunks at a time
        (pdorch/worker/drain_writes.py), each retained until written, so the next turns of its
        conversations read them from the store. Returns the pages to write (drain_progress() follows them)."""
        alloc = self._rt.allocator
        pages = [p for p in alloc.unstored_pages() if alloc.unpersisted_reason(p) != PENDING]
        if not (self.usable and pages):
            return 0
        self._drain = DrainWrites([alloc.page_hash(p) for p in pages], self._drain_chunk, self._drain_chunk_pages)
        self._drain.start()
        return self._drain.total

    def drain_progress(self) -> WriteBackProgress:
        return WriteBackProgress(0) if self._drain is None else self._drain.progress()

    def _drain_chunk(self, hashes: list[str]) -> int:
        alloc = self._rt.allocator
        pages = still_unstored(alloc, hashes)
        if not (self.usable and pages):
            return 0
        alloc.retain(pages)
        self.metrics.written.labels("drain").inc(len(pages))
        depths = [self._deferred_depths.pop(alloc.page_hash(p), None) for p in pages]
        self._submit(EvictSaved, pages, depths, ["drain"] * len(pages))
        return len(pages)

    def on_saved(self, done: IOCompletion) -> None:
        """Apply a save completion: which pages the store now holds, and why the others are not; a
        task's write-back gives its lease back (the scheduler releases the task's pages once it holds
        none), a write-before-evict its retained pages."""
        alloc, tag = self._rt.allocator, done.tag
        if not isinstance(tag, (TaskSaved, EvictSaved)):
            raise TypeError(f"prefill persistence: unknown store write tag {tag!r}")
        self._rec.count_written_by_reason(self._settle(done))
        self._rec.count_store_written(done.pages_ok, kind="writeback")
        if isinstance(tag, EvictSaved):  # write-before-evict retained the pages: now they may go
            alloc.release(tag.pages)
            if tag.why[:1] == ["drain"] and self._drain is not None:  # the drain's next chunk
                self._drain.landed(done.pages_ok, len(tag.pages))
        else:
            tag.task.io.give_back(STORE_SAVE)
            spans.written(tag.task, done, self._rt.pool.page_nbytes)

    def _settle(self, done) -> collections.Counter:
        alloc, tag = self._rt.allocator, done.tag
        pages, keys, depths = tag.pages, tag.keys, tag.depths
        if isinstance(tag, EvictSaved) and tag.why[:1] == ["restore"]:  # the next chunk of the rewrite
            self._restore.landed()
            self._restore.pump(self._rewrite_chunk)
        ok = list(done.page_ok) + [False] * (len(pages) - len(done.page_ok))
        taken = collections.Counter(why for why, good in zip(tag.why, ok) if good)
        if not pages:  # no L1 to track: every page of the save was computed here
            taken["computed"] = done.pages_ok
        alloc.mark_persisted([p for p, good in zip(pages, ok) if good])
        alloc.mark_unpersisted([p for p, good in zip(pages, ok) if not good],
                               done.reason if done.reason != "ok" else "write_failed")
        index = self._rt.chain_index
        if index is not None:
            # NOTE: (again) now that they are in the store: a key the evictor tried while it was still
            # being written was found absent and forgotten.
            for key, depth, good in zip(keys, depths, ok):
                if good and depth is not None:
                    index.touch([key], first_depth=depth)
        return taken

    def left_store(self, keys) -> None:
        """The store evictor removed these keys: L1 pages holding them are no longer persisted."""
        alloc = self._rt.allocator
        alloc.mark_left_store(alloc.pages_of([k.rpartition("/")[2] for k in keys]), STORE_EVICTED)

    def _submit(self, make_tag, pages: list[int], depths: list, why: list[str]) -> bool:
        """`make_tag(pages, keys, depths, why)`: the completion tag (TaskSaved or EvictSaved)."""
        alloc, rt = self._rt.allocator, self._rt
        # NOTE: a page whose hash was already cached on another page is not cached itself; the
        # other page is the one L1 keeps (and the one persistence is tracked on).
        kept = [(p, d, w) for p, d, w in zip(pages, depths, why) if alloc.page_hash(p) is not None]
        if not kept:
            return False
        pages, depths, why = [k[0] for k in kept], [k[1] for k in kept], [k[2] for k in kept]
        alloc.mark_unpersisted(pages, PENDING)
        keys = [store_key(rt.fingerprint, alloc.page_hash(p)) for p in pages]
        rt.store_io.submit_save(make_tag(pages, keys, depths, why), keys, rt.pool.page_addrs(pages))
        return True
