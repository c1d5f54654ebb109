"""Pages a master leader switch lost, written again from the decode worker's own prefix cache.

After a switch the store client audits what this worker wrote lately (store_client/recent_writes.py)
and hands over the page keys the new leader lacks. The decode worker wrote them (generated pages,
prompt pages it computed); its prefix cache (decode_node/prefix_cache.py) may still hold them. Each
held page is written again, retained until the write lands (as the prefill worker's write-before-
evict, prefill_node/persistence.py `rewrite_lost`), a few chunks at a time (pdorch/worker/
restore_backlog.py), so the next turn reads it from the store instead of recomputing it. Pages L1
gave up meanwhile stay lost (a miss, recomputed; never wrong).

Scheduler thread only (the allocator is its own).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import Counter

from engine.page_allocator import PENDING
from pdorch.worker.restore_backlog import LOST, RestoreBacklog, still_lost
from store_client.page_hash import store_key


@dataclass(frozen=True, eq=False)
class Restore:
    """The completion tag of one rewrite: the retained pages, released when it lands."""

    pages: tuple[int, ...]


class LostPages:
    def __init__(self, rt, cache, registry):
        self._rt, self._cache = rt, cache
        self._backlog = RestoreBacklog()
        self.restored = Counter("pdorch_decode_restored_pages", "Pages a master leader switch lost, written "
                                "again from the decode worker's prefix cache", registry=registry)

    def rewrite(self, keys) -> None:
        """Write again the pages among `keys` (store keys) that L1 still holds. A page whose write
        is in flight already is left to that write."""
        alloc = self._rt.allocator
        pages = [p for p in alloc.pages_of([k.rpartition("/")[2] for k in keys])
                 if alloc.unpersisted_reason(p) != PENDING]
        alloc.mark_left_store(pages, LOST)  # no longer in the store, whatever the rewrite does
        self._backlog.add(alloc.page_hash(p) for p in pages)
        self._backlog.pump(self._submit)

    def _submit(self, hashes: list[str]) -> bool:
        alloc, rt = self._rt.allocator, self._rt
        if rt.store_io is None or not rt.store.enabled:
            self._backlog.clear()  # the store is gone again: they stay lost (LOST)
            return False
        pages = still_lost(alloc, hashes)
        if not pages:
            return False
        self._cache.not_written(pages, PENDING)
        keys = [store_key(rt.fingerprint, alloc.page_hash(p)) for p in pages]
        rt.store_io.submit_save(Restore(tuple(pages)), keys, rt.pool.page_addrs(pages))
        return True  # NOTE: a dropped save completes too (not ok): saved() releases it all the same

    def saved(self, done) -> None:
        """A rewrite landed (IOCompletion tagged Restore): the store holds the ok pages again."""
        pages = list(done.tag.pages)
        self._cache.saved(pages, done.page_ok, done.reason)
        self.restored.inc(sum(1 for ok in done.page_ok if ok))
        self._rt.allocator.release(pages)
        self._backlog.landed()
        self._backlog.pump(self._submit)
