"""Prefix reuse for one prefill task: L1 match + allocation, store load, and caching what was made.

Tiers in order (DESIGN.md sections 4-5): the worker's own L1 (PageAllocator.match_prefix by page
hash), then the store for the next reusable pages, read with one batched `batch_get_into` straight
into the task's pool pages on the I/O thread. A missing key fails only its page and those after
it, so no separate existence check (and no read lease) is needed. Only full pages are cached,
and never the page holding the last prompt token (see task.reusable_pages).

Functions run on the scheduler thread only (they touch the allocator).
"""

from __future__ import annotations

from prefill_node.task import Phase, PrefillTask, reusable_pages
from store_client.page_hash import page_hashes, store_key


def admit(task: PrefillTask, rt, prefix_cache: bool) -> bool:
    """Give the task its pages (L1 matches first) and start its store load; False when the pool
    is full right now (nothing is held then)."""
    alloc, page_size = rt.allocator, task.job.page_size
    num_pages = -(-task.prompt_len // page_size)
    task.page_hashes = page_hashes(list(task.job.token_ids), page_size)
    reusable = task.page_hashes[:reusable_pages(task.prompt_len, page_size)]
    matched = alloc.match_prefix(reusable) if prefix_cache else []
    if num_pages - len(matched) > alloc.num_available():
        alloc.release(matched)
        return False
    task.page_ids = list(matched) + alloc.allocate(num_pages - len(matched))
    task.device_pages = len(matched)
    task.num_computed_tokens = len(matched) * page_size
    to_load = reusable[len(matched):]
    if to_load and rt.store_io is not None and rt.store.enabled:
        keys = [store_key(rt.fingerprint, h) for h in to_load]
        rt.store_io.submit_load(("load", task), keys, rt.pool.page_addrs(task.page_ids[len(matched):len(reusable)]))
        task.io_pending += 1
        task.phase = Phase.LOADING
    else:
        task.phase = Phase.COMPUTING
    return True


def on_loaded(task: PrefillTask, rt, pages_ok: int, prefix_cache: bool) -> None:
    """The store load finished: `pages_ok` leading pages are in the pool; compute from there."""
    task.store_pages = pages_ok
    if prefix_cache:
        for i in range(task.device_pages, task.device_pages + pages_ok):
            rt.allocator.cache(task.page_hashes[i], task.page_ids[i])
    task.num_computed_tokens = (task.device_pages + pages_ok) * task.job.page_size
    task.phase = Phase.COMPUTING


def keep_computed(task: PrefillTask, rt, prefix_cache: bool, write_back: bool) -> bool:
    """Cache the full pages computed here in L1 and queue them for write-back; True if a save was queued.

    NOTE: the save reads the pages on the I/O thread, so the task keeps them until its completion.
    """
    new_full = range(task.device_pages + task.store_pages, len(task.page_hashes))
    if prefix_cache:
        for i in new_full:
            rt.allocator.cache(task.page_hashes[i], task.page_ids[i])
    if not (write_back and len(new_full) and rt.store_io is not None and rt.store.enabled):
        return False
    keys = [store_key(rt.fingerprint, task.page_hashes[i]) for i in new_full]
    rt.store_io.submit_save(("save", task), keys, rt.pool.page_addrs([task.page_ids[i] for i in new_full]))
    task.io_pending += 1
    return True
