"""Preemption on the decode worker: when the pool cannot give a running request its next page, a
victim gives its pages back and resumes later from the KV pdorch already keeps, instead of the
stream being cut.

Who (choose_victim): the decoding request that joined the batch LAST, as vLLM preempts (the newest
has the least KV to restore and has waited least). A resumed request keeps its place in that order,
so it can only be preempted again by requests older than itself, never over and over by the new
ones; and while any preempted request waits, admission takes nobody new (decode_node/admission.py):
it goes first.

What it keeps (preempt):

    positions 0 .. L-2 have KV (L = its token ids; the newest token is fed next, at L-1)
    full pages 0 .. F-1 (F = (L-1) // page_size)  -> released: they stay in the prefix cache under
        their hash (evictable: tail pages first) and were written to the store as they filled
        (decode.offload_generated_kv; prompt pages by P's write-back or ours)
    the partial page F, if any                     -> KEPT: no cache holds it (it has no hash yet),
        and keeping it means no token is ever recomputed when the full pages come back
    pages an offload write still reads             -> given back once it completed (parked)

How it comes back (resume, oldest preempted first, once admission's check says it fits):

    full page k: D's prefix cache (lookup by hash)  -> "cache"
                 else a store read (one batch)      -> "store"
                 else computed in the batch again   -> "recomputed" (counts only itself, a hole)
    page F: the kept page ("cache"; recomputed only if tails were dropped, see drop_tails)

The request's sampling state (generator, stop checker, the tokens so far) never left it: the first
token after the resume is the one an uninterrupted run samples. Its stream only pauses: a `paused`
event goes out at the preemption (the router keeps its client's connection alive on it and counts
usage.preemptions), the first event after the resume says how long the pause was.

Scheduler thread only (the allocator is its own); decode_node/scheduler.py calls in.
"""

from __future__ import annotations

import bisect

from prometheus_client import Counter, Gauge, Histogram

from decode_node import spans
from decode_node.messages import ResumeRead
from decode_node.request import DecodeRequest
from pdorch.worker.prompt_pages import page_ranges
from store_client.page_hash import store_key

SOURCES = ("cache", "store", "recomputed")


def choose_victim(candidates: list[DecodeRequest]) -> DecodeRequest:
    """The request to preempt among decoding ones: the one that joined the batch last."""
    return max(candidates, key=lambda r: r.arrival)


def kv_layout(num_tokens: int, page_size: int) -> tuple[int, int]:
    """(full pages, tokens in the partial page after them) of a request's KV: positions 0 .. L-2."""
    return (num_tokens - 1) // page_size, (num_tokens - 1) % page_size


class Preemption:
    def __init__(self, rt, cache, registry):
        self._rt, self._cache = rt, cache
        self._alloc, self._page_size = rt.allocator, rt.page_size
        self.waiting: list[DecodeRequest] = []  # preempted, by arrival (they resume in this order)
        self.reading: list[DecodeRequest] = []  # resuming, their store read in flight
        self.total = 0  # preemptions since start (Info)
        self._preemptions = Counter("pdorch_decode_preemptions", "Running requests preempted: the pool could "
                                    "not give one its next page (it resumes from the KV kept in the pool and "
                                    "the store)", registry=registry)
        self._resumed = Counter("pdorch_decode_resumed_tokens", "KV tokens of preempted requests restored on "
                                "resume, by source: cache (this worker's pool: its prefix cache and the kept "
                                "partial page), store (read back), recomputed", ["source"], registry=registry)
        for source in SOURCES:
            self._resumed.labels(source)
        self._paused = Histogram("pdorch_decode_preempted_seconds", "Time a preempted request's stream was "
                                 "paused, from its preemption to decoding again", registry=registry,
                                 buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
        self._tails = Counter("pdorch_decode_preempted_tails_dropped", "Kept partial pages of preempted "
                              "requests given back because nothing could run otherwise (recomputed on "
                              "resume)", registry=registry)
        Gauge("pdorch_decode_preempted_requests", "Requests preempted right now, waiting to resume",
              registry=registry).set_function(lambda: len(self.waiting) + len(self.reading))

    # ------------------------------------------------------------------------------ preempt
    def preempt(self, req: DecodeRequest, now: float) -> None:
        """Take `req`'s pages back but its partial last page (its KV: see the module doc)."""
        full, partial = kv_layout(len(req.token_ids), self._page_size)
        # NOTE: pages past the KV (the spare page admission gives a prompt that fills its last page)
        # hold nothing: they go back with the full ones
        held = req.pages.take()
        req.preempt.kept_pages = held[full:full + 1] if partial else []
        give = held[:full] + held[full + len(req.preempt.kept_pages):]
        if len(req.io) > 0:  # an offload write still reads some of them: back once it completed
            req.preempt.parked_pages = give
        else:
            self._alloc.release(give)
        req.preempt.count += 1
        req.preempt.paused_since = now
        bisect.insort(self.waiting, req, key=lambda r: r.arrival)
        self.total += 1
        self._preemptions.inc()

    def settle(self) -> None:
        """Give back parked pages whose offload writes have completed."""
        for req in self.waiting:
            if req.preempt.parked_pages and len(req.io) == 0:
                self._alloc.release(req.preempt.parked_pages)
                req.preempt.parked_pages = []

    def returning(self) -> bool:
        """Pages of a preempted request come back as soon as an offload write completes."""
        return any(req.preempt.parked_pages for req in self.waiting)

    def drop_tails(self) -> None:
        """Nothing runs and the oldest preempted request does not fit: the others' kept partial pages
        go back too (their few tokens are recomputed on resume), so it can."""
        for req in self.waiting[1:]:
            if req.preempt.kept_pages:
                self._alloc.release(req.preempt.kept_pages)
                self._tails.inc()
                req.preempt.kept_pages = []

    def forget(self, req: DecodeRequest) -> None:
        """`req` ends while preempted: what it still holds goes back to req.page_ids (freed with it)."""
        if req in self.waiting:
            self.waiting.remove(req)
        req.pages.reset(req.preempt.parked_pages + req.preempt.kept_pages + req.pages.take())
        req.preempt.parked_pages, req.preempt.kept_pages = [], []

    # ------------------------------------------------------------------------------- resume
    def pages_to_resume(self, req: DecodeRequest) -> int:
        """Pages a resume takes from the pool at most (prefix-cache hits count as taken): its KV and
        the page its next position goes to (it decodes at least one token before it can be
        preempted again: never a preemption without progress)."""
        full, _ = kv_layout(len(req.token_ids), self._page_size)
        return full + 1 - len(req.preempt.kept_pages)

    def resume(self, req: DecodeRequest) -> bool:
        """Give `req` its pages again: prefix-cache hits as they are, the kept partial page, new pages
        for the rest, read from the store where it can. True: its KV is in place or queued to be
        computed (ready for the batch); False: wait for its store read (read_done)."""
        self.waiting.remove(req)
        full, partial = kv_layout(len(req.token_ids), self._page_size)
        hashes = req.page_hashes[:full]
        assert len(hashes) == full, "every full page of a decoding request has its hash"
        found = self._alloc.lookup(hashes) if self._cache.enabled else [None] * full
        missing = [k for k, page in enumerate(found) if page is None]
        tail_lost = bool(partial) and not req.preempt.kept_pages
        # page `full`: the kept partial page, else a new one (the lost tail is computed into it, or,
        # with no partial page, the next position goes there)
        fresh = iter(self._alloc.allocate(len(missing) + (0 if req.preempt.kept_pages else 1)))
        pages = [page if page is not None else next(fresh) for page in found]
        req.pages.reset(pages + (req.preempt.kept_pages or [next(fresh)]))
        req.preempt.kept_pages = []
        req.preempt.resuming = True
        self._resumed.labels("cache").inc((full - len(missing)) * self._page_size + (0 if tail_lost else partial))
        store, io = self._rt.store, self._rt.store_io
        if missing and io is not None and store is not None and store.enabled:
            keys = [store_key(self._rt.fingerprint, req.page_hashes[k]) for k in missing]
            io.submit_load(ResumeRead(req, tuple(missing), tail_lost), keys,
                           self._rt.pool.page_addrs([req.page_ids[k] for k in missing]))
            self.reading.append(req)
            return False
        self._plan_rest(req, missing, tail_lost)
        return True

    def read_done(self, done) -> DecodeRequest | None:
        """The store read of a resume completed: the request, ready for the batch (None: it ended
        meanwhile, its pages are given back now that nothing writes into them)."""
        read: ResumeRead = done.tag
        req = read.req
        self.reading.remove(req)
        if req.done:
            self._alloc.release(req.pages.take())
            return None
        ok = tuple(done.page_ok) + (False,) * (len(read.pages) - len(done.page_ok))
        loaded = [k for k, good in zip(read.pages, ok) if good]
        self._cache.pages_loaded(req, loaded)
        self._resumed.labels("store").inc(len(loaded) * self._page_size)
        self._plan_rest(req, [k for k, good in zip(read.pages, ok) if not good], read.tail_lost)
        return req

    def _plan_rest(self, req: DecodeRequest, holes: list[int], tail_lost: bool) -> None:
        """What the batch computes before `req` decodes again: the full pages no tier held (written
        to the store once computed), and the partial page if it was not kept."""
        full, _ = kv_layout(len(req.token_ids), self._page_size)
        tail = [(full * self._page_size, len(req.token_ids) - 1)] if tail_lost else []
        req.compute.plan(page_ranges(holes, self._page_size, tail), list(holes))
        self._resumed.labels("recomputed").inc(sum(end - start for start, end in req.compute.todo))

    def resumed(self, req: DecodeRequest, now: float) -> None:
        """`req`'s KV is whole again: it decodes from this step on; its stream learns how long it paused."""
        req.preempt.resuming = False
        if req.preempt.paused_since is not None:
            spans.resumed(req, req.preempt.paused_since)
        paused = now - (req.preempt.paused_since if req.preempt.paused_since is not None else now)
        req.preempt.paused_since = None
        self._paused.observe(paused)
        req.preempt.unreported_s += paused

    def requests(self) -> list[DecodeRequest]:
        return self.waiting + self.reading
