"""Keeping L1 pages in the store: write-back, backfill, write-before-evict (no self-made holes).

docs/design.md section 4: a page leaves L1 only once the store holds it, or with a counted reason.

    computed here ----write-back----\\
    L1 hit, store lacks it --backfill-+--> one submit_save per request --> completion:
    evictable, store lacks it,        |     ok    -> allocator.mark_persisted
      pool short of pages --write-----/     other -> allocator.mark_unpersisted(reason)
      before evict (pages retained until written)

The allocator hands out persisted pages before unpersisted ones, so an unpersisted page is only
dropped when nothing else is left: then its reason ("cancelled", "dropped", "timeout", "no_space",
"store_disabled", ...) is counted in `pdorch_prefill_l1_dropped_unpersisted_pages_total`.

Runs on the scheduler thread only (it touches the allocator).
"""

from __future__ import annotations

from functools import partial

from prometheus_client import Counter, Gauge

from engine.page_allocator import LEFT_STORE as STORE_EVICTED  # the store dropped it on purpose
from prefill_node.messages import EvictSaved, TaskSaved
from store_client.page_hash import store_key

PENDING = "pending"  # a write of the page is queued or running


def needs_write(alloc, page: int) -> bool:
    """A cached page the store lacks that nobody is writing and the store did not drop on purpose."""
    return not alloc.is_persisted(page) and alloc.unpersisted_reason(page) not in (PENDING, STORE_EVICTED)


class PersistMetrics:
    def __init__(self, registry):
        p = "pdorch_prefill_"
        self.unpersisted = Gauge(p + "l1_unpersisted_pages", "L1 pages the store is not known to hold",
                                 registry=registry)
        self.dropped = Counter(p + "l1_dropped_unpersisted_pages", "L1 pages evicted while the store lacked "
                               "them, by why it lacked them", ["reason"], registry=registry)
        self.written = Counter(p + "l1_persist_pages", "L1 pages queued for a store write, by kind "
                               "(writeback = computed here, backfill = L1 hit the store lacked, "
                               "evict = written before eviction)", ["kind"], registry=registry)
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
        for kind in ("writeback", "backfill", "evict"):
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

    def __init__(self, rt, write_back: bool, prefix_cache: bool, metrics: PersistMetrics):
        self._rt = rt
        self.enabled = write_back and rt.store_io is not None  # store.write_back and a store client
        self._prefix_cache = prefix_cache
        self.metrics = metrics

    @property
    def usable(self) -> bool:
        return self.enabled and self._rt.store.enabled

    def save_task_pages(self, task) -> bool:
        """Cache the task's computed full pages in L1 and write them (plus its backfill) to the store
        in one save. True if a save was queued (the task keeps its pages until it completes)."""
        alloc = self._rt.allocator
        computed = task.computed_full_pages()
        pages = [task.page_ids[i] for i in computed]
        if not self._prefix_cache:  # no L1: write the pages, nothing to track
            if not (self.usable and pages):
                return False
            self.metrics.written.labels("writeback").inc(len(pages))
            keys = [store_key(self._rt.fingerprint, task.page_hashes[i]) for i in computed]
            self._rt.store_io.submit_save(TaskSaved(task, [], [], []), keys, self._rt.pool.page_addrs(pages))
            return True
        for i in computed:
            alloc.cache(task.page_hashes[i], task.page_ids[i])
        evictor = self._rt.evictor
        if evictor is not None and self.usable:
            below = {i for i in computed if not evictor.should_write(i, len(computed))}
            if below:  # deeper than what the store keeps now: L1 keeps them (as pages the store dropped)
                alloc.mark_left_store([task.page_ids[i] for i in below], STORE_EVICTED)
                task.unstored = sorted(below)  # D's prefix cache is told too
                self.metrics.skipped.inc(len(below))
                computed = [i for i in computed if i not in below]
                pages = [task.page_ids[i] for i in computed]
        if not self.usable:
            alloc.mark_unpersisted(pages, "store_disabled" if self.enabled else "write_back_off")
            return False
        backfill = [task.page_ids[i] for i in task.backfill]
        self.metrics.written.labels("writeback").inc(len(pages))
        self.metrics.written.labels("backfill").inc(len(backfill))
        return self._submit(partial(TaskSaved, task), pages + backfill, computed + task.backfill)

    def write_before_evict(self, n: int) -> int:
        """Retain up to n unpersisted evictable pages and write them; they are released (and become
        reclaimable without loss) when the write completes. Returns the pages submitted."""
        if not self.usable or n <= 0:
            return 0
        # NOTE: lru_unpersisted() never offers pages the store dropped on purpose (their own tier) nor
        # pages being written (retained), so every page it offers needs_write().
        pages = self._rt.allocator.lru_unpersisted(n)
        if not pages:
            return 0
        self._rt.allocator.retain(pages)
        self.metrics.written.labels("evict").inc(len(pages))
        self._submit(EvictSaved, pages, [None] * len(pages))
        return len(pages)

    def on_saved(self, done) -> None:
        """Apply a save completion: which pages the store now holds, and why the others are not."""
        alloc, tag = self._rt.allocator, done.tag
        pages, keys, depths = tag.pages, tag.keys, tag.depths
        ok = list(done.page_ok) + [False] * (len(pages) - len(done.page_ok))
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

    def left_store(self, keys) -> None:
        """The store evictor removed these keys: L1 pages holding them are no longer persisted."""
        alloc = self._rt.allocator
        alloc.mark_left_store(alloc.pages_of([k.rpartition("/")[2] for k in keys]), STORE_EVICTED)

    def _submit(self, make_tag, pages: list[int], depths: list) -> bool:
        """`make_tag(pages, keys, depths)`: the completion tag (TaskSaved or EvictSaved)."""
        alloc, rt = self._rt.allocator, self._rt
        # NOTE: a page whose hash was already cached on another page is not cached itself; the
        # other page is the one L1 keeps (and the one persistence is tracked on).
        kept = [(p, d) for p, d in zip(pages, depths) if alloc.page_hash(p) is not None]
        if not kept:
            return False
        pages, depths = [p for p, _ in kept], [d for _, d in kept]
        alloc.mark_unpersisted(pages, PENDING)
        keys = [store_key(rt.fingerprint, alloc.page_hash(p)) for p in pages]
        rt.store_io.submit_save(make_tag(pages, keys, depths), keys, rt.pool.page_addrs(pages))
        return True
