"""Pages a master leader switch lost, written again from the decode worker's own prefix cache.

After a switch the store client audits what this worker wrote lately (store_client/recent_writes.py)
and hands over the page keys the new leader lacks. The decode worker wrote them (generated pages,
prompt pages it computed); its prefix cache (decode_node/prefix_cache.py) may still hold them. Each
held page is written again, retained until the write lands (as the prefill worker's write-before-
evict, prefill_node/persistence.py `rewrite_lost`), so the next turn reads it from the store instead
of recomputing it. Pages L1 gave up meanwhile stay lost (a miss, recomputed; never wrong).

Scheduler thread only (the allocator is its own).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import Counter

from decode_node.prefix_cache import PENDING
from store_client.page_hash import store_key

LOST = "lost_on_leader_change"  # unpersisted: the new leader lacked it and the rewrite did not land
CHUNK_PAGES = 64  # pages per store write: the I/O queue's budget (store.max_pending_save_pages) drops bigger


@dataclass(frozen=True, eq=False)
class Restore:
    """The completion tag of one rewrite: the retained pages, released when it lands."""

    pages: tuple[int, ...]


class LostPages:
    def __init__(self, rt, cache, registry):
        self._rt, self._cache = rt, cache
        self.restored = Counter("pdorch_decode_restored_pages", "Pages a master leader switch lost, written "
                                "again from the decode worker's prefix cache", registry=registry)

    def rewrite(self, keys) -> int:
        """Write again the pages among `keys` (store keys) that L1 still holds; returns how many
        were submitted. A page whose write is in flight already is left to that write."""
        alloc, rt = self._rt.allocator, self._rt
        pages = [p for p in alloc.pages_of([k.rpartition("/")[2] for k in keys])
                 if alloc.unpersisted_reason(p) != PENDING]
        alloc.mark_left_store(pages, LOST)  # no longer in the store, whatever the rewrite does
        if rt.store_io is None or not rt.store.enabled or not pages:
            return 0
        submitted = 0
        for i in range(0, len(pages), CHUNK_PAGES):
            chunk = pages[i:i + CHUNK_PAGES]
            alloc.retain(chunk)
            self._cache.not_written(chunk, PENDING)
            keys = [store_key(rt.fingerprint, alloc.page_hash(p)) for p in chunk]
            if not rt.store_io.submit_save(Restore(tuple(chunk)), keys, rt.pool.page_addrs(chunk)):
                break  # the queue is full: its completion (dropped) releases this chunk; the rest stay lost
            submitted += len(chunk)
        return submitted

    def saved(self, done) -> None:
        """A rewrite landed (IOCompletion tagged Restore): the store holds the ok pages again."""
        pages = list(done.tag.pages)
        self._cache.saved(pages, done.page_ok, done.reason)
        self.restored.inc(sum(1 for ok in done.page_ok if ok))
        self._rt.allocator.release(pages)
