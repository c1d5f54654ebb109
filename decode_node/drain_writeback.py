"""The decode worker's L1 written back as it drains (pdorch/worker/drain.py runs it).

Its prefix cache holds pages the store lacks only where a step's write failed or the store was
down (offload writes the rest with the step that fills them); the pages the store's evictor dropped
on purpose (LEFT_STORE) stay dropped. Once its streams are over or handed on, those pages are
written a few chunks at a time (pdorch/worker/drain_writes.py: one write of them all could exceed
the I/O queue's budget and be dropped whole), each retained until it completes, so the next turns of
the conversations it served read them from the store. Scheduler thread only (the allocator is its own).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.page_allocator import PENDING
from pdorch.worker.drain_writes import DrainWrites, chunk_pages_for, still_unstored
from store_client.page_hash import store_key


@dataclass(frozen=True)
class DrainSaved:
    """The tag of one chunk of the drain's store write: the pages it retained, and the write-back it is part of."""

    pages: tuple[int, ...]
    writes: DrainWrites


def submit_write_back(rt, max_pending_save_pages: int) -> DrainWrites | None:
    """Start writing every cached page the store lacks (but those being written), in chunks that leave
    room in the I/O queue's budget (store.max_pending_save_pages); None: none to write."""
    if rt.store_io is None or not rt.store.enabled:
        return None
    alloc = rt.allocator
    pages = [p for p in alloc.unstored_pages() if alloc.unpersisted_reason(p) != PENDING]
    if not pages:
        return None
    writes = DrainWrites([alloc.page_hash(p) for p in pages], lambda hashes: _submit_chunk(rt, writes, hashes),
                         chunk_pages_for(max_pending_save_pages))
    writes.start()
    return writes


def _submit_chunk(rt, writes: DrainWrites, hashes: list[str]) -> int:
    alloc = rt.allocator
    pages = still_unstored(alloc, hashes)
    if not (pages and rt.store.enabled):
        return 0
    alloc.retain(pages)
    alloc.mark_unpersisted(pages, PENDING)
    keys = [store_key(rt.fingerprint, alloc.page_hash(p)) for p in pages]
    rt.store_io.submit_save(DrainSaved(tuple(pages), writes), keys, rt.pool.page_addrs(pages))
    return len(pages)


def write_back_saved(rt, cache, recorder, done) -> None:
    """A chunk of the drain's write completed: the store holds the ok pages; all of them go back to the
    pool; the next chunk goes."""
    pages = list(done.tag.pages)
    cache.saved(pages, done.page_ok, done.reason)
    written = sum(1 for ok in done.page_ok if ok)
    recorder.count_written_by_reason({"drain": written})
    rt.allocator.release(pages)
    done.tag.writes.landed(written, len(pages))
