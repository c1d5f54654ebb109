"""The decode worker's own prefix cache (D's L1): the KV of every request it served stays in its
pool, under each full page's hash, until the pool needs the page for another request.

Why: conditional disaggregation made the decode worker compute most short turns itself, and every
request's KV passes through it (pushed by P, read from the store, computed here, generated). With
the store as the only home of that KV, the store's eviction decided what the next turn found, and
no L1 ever held it (docs/workers.md, "Where a conversation's KV lives"). Now the pool keeps it:
the next turn's admission looks its reusable pages up here first (decode_node/admission.py), the
plan asks the store only for the others (decode_node/prompt_kv.py), and a prefill worker serving a
long tail reads the pages held here straight from this pool (`decode_cached_pages`).

What is cached, and when (scheduler thread only: the allocator is its own):

    prompt pages     once the whole prompt KV is in place: at Join when nothing is left to compute
                     here, else when the local prefill (or the fill of pages it failed to read) ends
    generated pages  when the step that fed a page's last position has run
    resumed pages    a preempted request's pages read back from the store or recomputed, as they
                     land (decode_node/preemption.py; its other pages are still cached)

How long (the allocator's order, engine/page_allocator.py: free pages, then pages held elsewhere,
then pages the store dropped (newest first), then the others):

    read from the store, or written to it   -> persisted: the store holds it
    pushed by a prefill worker              -> persisted too: its write-back writes it
    removed by the store evictor, or not    -> left the store: kept after the persisted ones
      written because it would rank below      (L1 keeps what the store dropped); P's answer
      what eviction removes right now          names the pushed pages it does not write
    computed or generated here, not yet     -> unpersisted (kept longest; a loss is counted by
      written (write failed, offload off)      reason in pdorch_decode_l1_dropped_unpersisted_pages)
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from engine.page_allocator import LEFT_STORE, PENDING


class DecodePrefixCache:
    def __init__(self, allocator, page_size: int, enabled: bool, registry):
        self._alloc = allocator
        self._page_size = page_size
        self.enabled = enabled
        self._pages = Gauge("pdorch_decode_l1_pages", "Pages of the decode worker's prefix cache (held under "
                            "their hash; in use or evictable)", registry=registry)
        self.hits = Counter("pdorch_decode_l1_hit_pages", "Reusable prompt pages found in the decode worker's "
                            "own prefix cache at admission", registry=registry)
        self._dropped = Counter("pdorch_decode_l1_dropped_unpersisted_pages", "Prefix-cache pages given up "
                                "while the store was not known to hold them, by why", ["reason"], registry=registry)
        self._seen: dict[str, int] = {}

    def prompt_in_place(self, req) -> None:
        """Every prompt page's KV is in req's pages: cache the full ones (the L1 hits already are)."""
        if not self.enabled:
            return
        held, computed, unstored = set(req.l1_pages), set(req.compute.pages), set(req.unstored_pages)
        for k in range(req.prompt_len // self._page_size):
            if k in held:
                continue
            page = req.page_ids[k]
            if self._alloc.cache(req.page_hashes[k], page) != page:
                continue  # another page holds this hash already (two requests, one prompt)
            if k in computed:
                self._alloc.mark_unpersisted([page], PENDING)  # written with the step's store write
            elif k in unstored:  # P computed it but did not write it: the store would drop it at once
                self._alloc.mark_left_store([page], LEFT_STORE)
            else:  # read from the store (`loaded`), or pushed by the prefill worker (held elsewhere)
                self._alloc.mark_persisted([page])

    def page_filled(self, req, k: int) -> bool:
        """Generated page k of req is full: cache it. True when this page now holds the hash."""
        if not self.enabled:
            return False
        page = req.page_ids[k]
        if self._alloc.cache(req.page_hashes[k], page) != page:
            return False
        self._alloc.mark_unpersisted([page], PENDING)
        return True

    def pages_loaded(self, req, ks) -> None:
        """Pages k of req were read back from the store (a preempted request's resume): cache them,
        persisted."""
        if not self.enabled:
            return
        for k in ks:
            page = req.page_ids[k]
            if self._alloc.cache(req.page_hashes[k], page) == page:
                self._alloc.mark_persisted([page])

    def saved(self, pages, page_ok, reason: str) -> None:
        """A store write of these pages completed: the store holds the ok ones."""
        ok = list(page_ok) + [False] * (len(pages) - len(page_ok))
        self._alloc.mark_persisted([p for p, good in zip(pages, ok) if good])
        self._alloc.mark_unpersisted([p for p, good in zip(pages, ok) if not good],
                                     reason if reason != "ok" else "write_failed")

    def not_written(self, pages, reason: str) -> None:
        """These cached pages will not be written (offload off, store down): unpersisted, by reason."""
        self._alloc.mark_unpersisted(list(pages), reason)

    def skipped(self, pages) -> None:
        """Not written: the store would evict them at once. The prefix cache keeps them."""
        self._alloc.mark_left_store(list(pages), LEFT_STORE)

    def left_store(self, hashes) -> None:
        """The store evictor removed these pages: keep them after the ones the store still holds."""
        self._alloc.mark_left_store(self._alloc.pages_of(hashes), LEFT_STORE)

    def sync_metrics(self) -> None:
        """Export the allocator's counts (once per scheduler iteration)."""
        self._pages.set(self._alloc.num_cached())
        for reason, n in self._alloc.evicted_unpersisted.items():
            if n != self._seen.get(reason, 0):
                self._dropped.labels(reason).inc(n - self._seen.get(reason, 0))
                self._seen[reason] = n
