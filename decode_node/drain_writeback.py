"""The decode worker's L1 written back as it drains (pdorch/worker/drain.py runs it).

Its prefix cache holds pages the store lacks only where a step's write failed or the store was
down (offload writes the rest with the step that fills them); the pages the store's evictor dropped
on purpose (LEFT_STORE) stay dropped. Once its streams are over or handed on, those pages are
written in one store write, retained until it completes, so the next turns of the conversations it
served read them from the store. Scheduler thread only (the allocator is its own).
"""

from __future__ import annotations

from dataclasses import dataclass

from decode_node.prefix_cache import PENDING
from store_client.page_hash import store_key


@dataclass(frozen=True)
class DrainSaved:
    """The tag of the drain's store write: the pages it retained."""

    pages: tuple[int, ...]


def submit_write_back(rt) -> list[int]:
    """Write every cached page the store lacks (but those being written); the pages submitted."""
    if rt.store_io is None or not rt.store.enabled:
        return []
    alloc = rt.allocator
    pages = [p for p in alloc.unstored_pages() if alloc.unpersisted_reason(p) != PENDING]
    if not pages:
        return []
    alloc.retain(pages)
    alloc.mark_unpersisted(pages, PENDING)
    keys = [store_key(rt.fingerprint, alloc.page_hash(p)) for p in pages]
    rt.store_io.submit_save(DrainSaved(tuple(pages)), keys, rt.pool.page_addrs(pages))
    return pages


def write_back_saved(rt, cache, recorder, done) -> None:
    """The drain's write completed: the store holds the ok pages; all of them go back to the pool."""
    pages = list(done.tag.pages)
    cache.saved(pages, done.page_ok, done.reason)
    recorder.count_written_by_reason({"drain": sum(1 for ok in done.page_ok if ok)})
    rt.allocator.release(pages)


def pages_pending(alloc, pages) -> int:
    """Of `pages`, those whose write has not completed yet."""
    return sum(1 for p in pages if alloc.unpersisted_reason(p) == PENDING)
