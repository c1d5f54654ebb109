"""StepWrites: the store writes of one decode step, as ONE store write.

Every page that fills in a step (generated pages with decode.offload_generated_kv, and the full
prompt pages the decode worker computed itself) is collected by the step, which hands them here
once, at its end (`write`): one `StoreIO.submit_save` for all of them, each page owned by its
request so that an abort takes only its own pages out (StoreIO.cancel_owner). The completion comes
straight here (`saved`, routed by its tag, StepSaved): it tells the prefix cache what the store now
holds, counts the writes and ranks them for the chain evictor.

Each step write is an I/O lease on its owners' pages (`req.io`, pdorch/worker/leases.py), named
by the write ("step_write:<n>"; several steps' writes may be in flight for one request), given back
when that write completes. NOTE: the step hands its pages over before it finishes any request, so a
request finishing in this very step keeps its pages until the step's write has read them.
Scheduler thread only.
"""

from __future__ import annotations

from prometheus_client import Counter

from decode_node import spans
from decode_node.messages import PageWrite, StepSaved
from decode_node.request import DecodeRequest
from decode_node.restore import LostPages
from store_client.page_hash import store_key


class StepWrites:
    def __init__(self, rt, cache, recorder):
        self._rt, self._cache, self._rec = rt, cache, recorder
        self._writes = 0  # step writes submitted: the last one's lease is step_write:<_writes>
        # Pages a master leader switch lost, written again from L1; their completions come here too.
        self.restore = LostPages(rt, cache, recorder.registry)
        registry = recorder.registry
        self._steps = Counter("pdorch_decode_offload_steps", "Decode steps that filled pages to offload "
                              "(each submits ONE store write for all of them)", registry=registry)
        self._pages = Counter("pdorch_decode_offload_pages", "Generated pages submitted for offload",
                              registry=registry)
        self._skipped = Counter("pdorch_decode_store_writes_skipped_pages", "Pages not written: the store is "
                                "full and its chain eviction would remove them at once (the prefix cache "
                                "keeps them)", registry=registry)

    def write(self, filled: list[tuple[DecodeRequest, int, str]]) -> None:
        """One store write for the pages that filled in this step: (request, page index k, kind), kind
        "offload" (generated) or "writeback" (computed here). A page is left out when the store is off
        or would remove it at once (the chain evictor's water level); the prefix cache keeps it then."""
        rt, writes = self._rt, []
        for req, k, kind in filled:
            page = req.page_ids[k]
            if rt.store_io is None or not rt.store.enabled:
                self._cache.not_written([page], "store_disabled")
            elif rt.evictor is not None and not rt.evictor.should_write(k):
                self._cache.skipped([page])
                self._skipped.inc()
            else:
                writes.append(PageWrite(req, store_key(rt.fingerprint, req.page_hashes[k]), page, k, kind))
        if not writes:
            return
        self._writes += 1
        lease = f"step_write:{self._writes}"
        owners = tuple(dict.fromkeys(w.req for w in writes))
        for req in owners:  # NOTE: before the step finishes any of them (the module docstring)
            req.io.take(lease)
        generated = sum(1 for w in writes if w.kind == "offload")
        if generated:
            self._steps.inc()
            self._pages.inc(generated)
        rt.store_io.submit_save(StepSaved(owners, tuple(writes), lease), [w.key for w in writes],
                                rt.pool.page_addrs([w.page for w in writes]), owners=[w.req for w in writes])

    def saved(self, done) -> None:
        """A step's write completed (IOCompletion tagged StepSaved)."""
        saved: StepSaved = done.tag
        for req in saved.owners:
            req.io.give_back(saved.lease)
        spans.step_written(saved.owners, saved.writes, done, self._rt.pool.page_nbytes)
        self._cache.saved([w.page for w in saved.writes], done.page_ok, done.reason)
        for kind, reason in (("offload", "generated"), ("writeback", "computed")):
            written = sum(1 for w, ok in zip(saved.writes, done.page_ok) if ok and w.kind == kind)
            if written:
                self._rec.count_store_written(written, kind=kind)
                self._rec.count_written_by_reason({reason: written})
        index = self._rt.chain_index
        if index is not None:  # in the store now: the evictor ranks them by depth in their chain
            for w, ok in zip(saved.writes, done.page_ok):
                if ok:
                    index.touch([w.key], first_depth=w.depth)
