"""Prefix reuse for one prefill task: L1 lookup + allocation, one store load, the compute plan.

Tiers (docs/design.md section 4): every reusable page is looked up in the worker's own L1
(`PageAllocator.lookup` by page hash); the pages L1 lacks that the decode worker's pool holds
(`decode_cached_pages`: its own prefix cache) are read from there with one transfer-engine read,
and ALL the others are read with ONE store load (`batch_get_into` straight into the task's pool
pages, on the I/O thread). A page missing from
both is a hole: it costs only itself. The compute plan is then the holes, in order, followed by
the uncached tail; each range attends to every page before it, whichever tier that page came from.

    reusable pages   | 0 L1 | 1 store | 2 hole | 3 store | 4 L1 | tail (last page, partial) |
    computed             -       -      page 2      -        -     tail

Why gaps don't end the match: a page's key is the chained hash of ALL token ids up to its end,
so page 3's key names page 3's KV exactly, whether or not page 2 is at hand.
Only full pages are cached, never the page holding the last prompt token (pdorch/worker/prompt_pages.py).

Plans only: the admission phase (prefill_node/admission.py) calls `lookup` once, submits the reads it
plans (and holds their leases), and hands each completion to `on_loaded`. Owns `task.prefix`
(PrefixState, prefill_node/task.py), and with the scheduler's release is the only writer of
`task.page_ids` (allocated here; a given-up load's pages swapped here: `give_up_load`).
Functions run on the scheduler thread only (they touch the allocator).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from engine.page_allocator import pages_for
from pdorch.tracing import names
from pdorch.worker.prompt_pages import reusable_pages
from prefill_node.persistence import needs_write
from prefill_node.task import PrefillTask
from store_client.page_hash import page_hashes, store_key

if TYPE_CHECKING:
    from pdorch.worker.runtime import WorkerRuntime


def lookup(task: PrefillTask, rt: WorkerRuntime, prefix_cache: bool, allow_loss: bool) -> bool:
    """Give the task its pages (L1 hits first) and plan where the others come from: `reading` (D's pool),
    `loading` (one store load), the rest holes; with nothing to read, the holes are planned at once
    (`loads_left` 0). False when the pool cannot give the pages right now (nothing is held then;
    `task.prefix.pages_short` says how many are missing).

    allow_loss=False: only free pages and pages the store also holds may be reclaimed from L1.
    """
    alloc, page_size, state = rt.allocator, rt.page_size, task.prefix
    num_pages = pages_for(task.prompt_len, page_size)
    n_reuse = reusable_pages(task.prompt_len, page_size)
    # D hashed the prompt once and sent the hashes (validated count); older callers did not.
    state.hashes = list(task.job.page_hashes) or page_hashes(list(task.job.token_ids), page_size)
    # NOTE: prompt logprobs need every prompt position's logits: no page is reused (as vLLM)
    fresh = task.job.params.prompt_logprobs is not None
    found = alloc.lookup(state.hashes[:n_reuse]) if prefix_cache and not fresh else [None] * n_reuse
    found += [None] * (num_pages - n_reuse)
    need = found.count(None)
    available = alloc.num_available() if allow_loss else alloc.num_available_without_loss()
    if need > available:
        alloc.release([p for p in found if p is not None])
        state.pages_short = need - available
        return False
    new_pages = iter(alloc.allocate(need))
    task.page_ids = [p if p is not None else next(new_pages) for p in found]
    hits = [i for i in range(n_reuse) if found[i] is not None]
    state.inflight_pages = sum(1 for i in hits if state.hashes[i] in task.inflight.waited_for)  # computed while it waited
    state.device_pages = len(hits) - state.inflight_pages
    state.backfill = [i for i, page in enumerate(found[:n_reuse]) if page is not None and needs_write(alloc, page)]
    missing = [i for i in range(n_reuse) if found[i] is None]
    on_decode = set() if fresh else set(task.job.decode_cached_pages)  # D's pool holds them: read from there
    state.reading = [i for i in missing if i in on_decode]
    missing = [i for i in missing if i not in on_decode]
    if rt.chain_index is not None:  # the store evictor keeps recently used chains, heads longest
        # NOTE: reusable pages only: the others are not in the store yet (touched once written).
        rt.chain_index.touch([store_key(rt.fingerprint, h) for h in state.hashes[:n_reuse]], lookup=True)
    state.loads_left = int(bool(state.reading))
    if missing and rt.store_io is not None and rt.store is not None and rt.store.enabled and not fresh:
        state.loading = missing
        state.loads_left += 1
    else:
        state.missed = missing
        why = names.MISS_NOT_REUSED if fresh else names.MISS_STORE_UNAVAILABLE
        state.miss_reasons.update((i, why) for i in missing)
    if not state.loads_left:
        state.holes = list(missing)
    return True


def on_loaded(task: PrefillTask, rt: WorkerRuntime, pages: list[int], page_ok: Sequence[bool], prefix_cache: bool,
              from_decode: bool = False, page_ssd: Sequence[bool] = (), miss_reasons: Sequence[str] = ()) -> bool:
    """A store load (or a read from D's pool) of `pages` finished: the pages that arrived join L1 (as
    persisted when read from the store; read from D they are backfilled: the store may lack them),
    the others become holes once both have finished (True then: the holes are planned). `page_ssd`:
    per page, read from the store's SSD tier (counted apart from its DRAM); `miss_reasons`: per page
    that did not arrive, in order, why (names.MISS_*; a read from D's pool: decode_read_failed)."""
    alloc, state = rt.allocator, task.prefix
    ok = list(page_ok) + [False] * (len(pages) - len(page_ok))
    ssd = list(page_ssd) + [False] * (len(pages) - len(page_ssd))
    default = names.MISS_DECODE_READ_FAILED if from_decode else names.MISS_NOT_IN_STORE
    reasons = iter(miss_reasons)
    for i, good, disk in zip(pages, ok, ssd):
        if not good:
            state.missed.append(i)
            state.miss_reasons[i] = next(reasons, default)
            continue
        if from_decode:
            state.decode_pages += 1
        elif disk:
            state.ssd_pages += 1
        else:
            state.store_pages += 1
        if prefix_cache and alloc.cache(state.hashes[i], task.page_ids[i]) == task.page_ids[i]:
            if from_decode:  # the store may lack it: written with the write-back (skipped if present)
                state.backfill.append(i)
            else:
                alloc.mark_persisted([task.page_ids[i]])
    state.loads_left -= 1
    if state.loads_left > 0:
        return False
    state.loading, state.reading = [], []
    state.holes = sorted(state.missed)  # computed in order, then the tail (planned by prefill_node/step.py)
    return True


def give_up_load(task: PrefillTask, rt: WorkerRuntime, fresh: list[int], prefix_cache: bool
                 ) -> tuple[list[tuple[int, int]], bool]:
    """The task gives up on its store load (prefill_node/prefetch.py's policy): the pages being loaded
    are swapped for `fresh` ones and become holes (computed instead; none of them arrived). Returns
    the old (page index, page id) pairs, which stay with the load until it completes, and whether the
    holes are planned now (on_loaded)."""
    loading = list(task.prefix.loading)
    late = [(i, task.page_ids[i]) for i in loading]
    for i, page in zip(loading, fresh):
        task.page_ids[i] = page
    settled = on_loaded(task, rt, loading, (), prefix_cache, miss_reasons=[names.MISS_GIVEN_UP] * len(loading))
    return late, settled
