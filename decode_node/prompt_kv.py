"""The prompt phase of a decode request: the prompt's KV into the pages admission gave it, from
wherever it is. The handler thread's DecodeWorker calls `fill(req)` once; it decides where each
page comes from (decode_node/prompt_plan.py: the store existence check on a store-probe thread),
starts D's own store read of the pages it reads itself (decode_node/prefix_load.py), calls P for
the rest (decode_node/prefill_client.py: KV pushed into D's pages, first token back), waits for its
own read and applies the plan: what D still computes itself is left in `req.compute`.

    fill(req)   -> P's answer (PrefillResult), or None for a local plan (no P is called)

On a failure every page is safe to give back when it raises: D's own read is over or abandoned
(its pages left the request: the scheduler frees them once Mooncake stops writing), and pages P
may still write into were handed to the fence (decode_node/fence.py) unless P said its writes
are over.

NOTE: the existence check takes a read lease on the pages it finds (docs/design.md section 9); they
are the pages read right after, by D and by P.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter

from decode_node import spans
from decode_node.prefix_load import start_load
from decode_node.prompt_plan import PREFILL, REASONS, PromptPlan, plan_prompt
from decode_node.request import DecodeRequest
from engine.page_allocator import pages_for
from pdorch.config import DecodeConfig, StoreConfig
from pdorch.tracing import names, now_ns
from pdorch.worker.errors import Aborted, DeadlineExceeded, PeerFailed
from pdorch.worker.prefill_rpc import PrefillJob, PrefillResult
from pdorch.worker.prompt_pages import reusable_pages
from store_client.page_hash import store_key

if TYPE_CHECKING:  # the runtime module loads torch; this one is imported by light tests too
    from decode_node.fence import PageFence
    from decode_node.prefill_client import PrefillClient
    from decode_node.scheduler import DecodeScheduler
    from pdorch.worker.runtime import WorkerRuntime
    from store_client.store import KVStore

PROBE_TIMEOUT_S = 0.25  # a batch_is_exist takes ~1 ms; past this the store is stalled: go without it
PROBE_THREADS = 4
PROBE_MAX_OUTSTANDING = 64  # more checks than this unanswered: the store is stalled, do not queue more


class PromptKV:
    """Runs on handler threads; the allocator stays the scheduler's."""

    def __init__(self, rt: WorkerRuntime, decode: DecodeConfig, store: StoreConfig, reg: CollectorRegistry,
                 count_loaded: Callable[[int], None] = lambda n: None, scheduler: DecodeScheduler | None = None,
                 prefill_client: PrefillClient | None = None, fence: PageFence | None = None):
        """`count_loaded(n)`: the worker's own count of store pages read (its Stats' store_pages_loaded);
        `scheduler` (the pages a failure takes back), `prefill_client` and `fence`: what `fill` needs
        (a test of the plan alone leaves them out)."""
        self.rt, self.cfg, self.store_cfg = rt, decode, store
        self._scheduler, self._client, self._fence = scheduler, prefill_client, fence
        self._count_loaded = count_loaded
        # NOTE: the existence check runs on its own threads so a stalled store (a frozen master
        # never answers) costs a request PROBE_TIMEOUT_S, not its deadline; once that many checks
        # are unanswered, requests skip it at once (and nothing more queues behind the stuck ones).
        self._probes = concurrent.futures.ThreadPoolExecutor(PROBE_THREADS, thread_name_prefix="store-probe")
        self._probing = 0
        self._lock = threading.Lock()
        self._plans = Counter("pdorch_decode_prompt_plans", "Where each prompt's KV came from: prefill (a prefill "
                              "worker) or local (this decode worker, no prefill call), by reason",
                              ["where", "reason"], registry=reg)
        for where, reasons in REASONS.items():
            for reason in reasons:
                self._plans.labels(where, reason)
        self._loaded_pages = Counter("pdorch_decode_prefix_store_pages", "Prompt pages this decode worker read "
                                     "from the store itself (loaded) or meant to and could not (failed: computed "
                                     "here)", ["outcome"], registry=reg)

    def fill(self, req: DecodeRequest, cancelled: Callable[[], bool]) -> PrefillResult | None:
        """The prompt's KV in `req`'s pages (but what D computes itself, left in req.compute): P's
        answer, or None when the plan is local (conditional disaggregation: no prefill worker is
        called). Raises a WorkerError with every page safe to give back (module docstring)."""
        planning = now_ns()
        plan = self.prepare(req)  # where each page comes from; D's own store read starts
        try:
            store = self.rt.store
            spans.planned(req, plan, planning, self.rt.page_size, names.MISS_NOT_IN_STORE if store is not None
                          and store.enabled else names.MISS_STORE_UNAVAILABLE)
            res = None if plan.local else self._prefill(req, cancelled, plan)
            self.finish(req, plan, cancelled)  # D's own read landed: what D still computes is in req
        except BaseException:
            self._settle_read(req, plan, cancelled)  # NOTE: before any of its pages goes back
            raise
        return res

    def prepare(self, req: DecodeRequest) -> PromptPlan:
        """Where each page of the prompt KV comes from (counted by decision and reason), with D's own
        store read of the pages it reads itself started (plan.read)."""
        plan = self._decide(req)
        return replace(plan, read=start_load(self.rt, req, plan.load))

    def finish(self, req: DecodeRequest, plan: PromptPlan, cancelled: Callable[[], bool] = lambda: False) -> None:
        """Wait for D's own store read (see PrefixLoad.settle for the bound; a request `cancelled()`
        meanwhile abandons it at once), then leave in `req` what D computes itself before decoding."""
        ok = () if plan.read is None else plan.read.settle(req, self.store_cfg.op_timeout_s, cancelled)
        if ok is None and cancelled():
            raise Aborted(f"request {req.request_id} aborted while its prefix was read from the store")
        if ok is None and time.monotonic() > req.deadline:
            raise DeadlineExceeded(f"request {req.request_id} missed its deadline ({req.job.timeout_s:.1f}s) while "
                                   "its prefix was read from the store")
        if ok is None:
            raise PeerFailed(f"request {req.request_id}: the store read of its prefix did not finish within "
                             f"{self.store_cfg.op_timeout_s:g} s (store.op_timeout_s; the store is stalled)")
        if plan.read is not None:
            self._loaded_pages.labels("loaded").inc(sum(ok))
            self._loaded_pages.labels("failed").inc(len(ok) - sum(ok))
            self._count_loaded(sum(ok))
        plan.apply(req, ok, self.rt.page_size, () if plan.read is None else plan.read.from_ssd)

    def _prefill(self, req: DecodeRequest, cancelled: Callable[[], bool], plan: PromptPlan) -> PrefillResult:
        """Prefill on P into the prompt's pages (but those D holds or reads itself). When it fails and
        P did not say its writes (and reads) are over, the pages go to the fence (taken out of
        req.page_ids) instead of back to the pool."""
        assert self._scheduler is not None and self._client is not None and self._fence is not None
        rt, page_size, n = self.rt, self.rt.page_size, req.prompt_len
        timeout_s = req.deadline - time.monotonic()
        if not req.own_deadline:  # no client deadline: the operator's bound for a prefill applies
            timeout_s = min(timeout_s, self.cfg.prefill_timeout_s)
        job = PrefillJob(request_id=req.request_id, token_ids=req.job.token_ids, params=req.job.params,
                         decode_segment=rt.segment,
                         dest_page_addrs=tuple(rt.pool.page_addrs(req.page_ids[:pages_for(n, page_size)])),
                         timeout_s=timeout_s, page_size=page_size, model_fingerprint=rt.fingerprint,
                         page_hashes=tuple(req.page_hashes),
                         decode_loaded_pages=plan.not_from_prefill(),
                         decode_cached_pages=plan.held,
                         decode_ranks=tuple(rt.tp_ranks) if rt.tp_size > 1 else ())
        try:
            return self._client.prefill(req.job.prefill_address, job, timeout_s, cancelled)
        except BaseException as e:
            self._settle_read(req, plan, cancelled)  # NOTE: before the fence: no freed page may still be written
            if not getattr(e, "writes_over", False):
                self._fence.hold(req.job.prefill_address, req.request_id, self._scheduler.take_pages(req))
            raise

    def _settle_read(self, req: DecodeRequest, plan: PromptPlan, cancelled: Callable[[], bool]) -> None:
        """Before req.page_ids go back: D's own store read is over, or abandoned (at once for a request
        `cancelled()`): its pages then leave req.page_ids, the scheduler frees them once Mooncake stops
        writing into them."""
        if plan.read is not None:
            plan.read.settle(req, self.store_cfg.op_timeout_s, cancelled)
            if plan.read.abandoned and self._scheduler is not None:
                self._scheduler.drop_abandoned(req, plan.read)

    def _decide(self, req: DecodeRequest) -> PromptPlan:
        dc, store, page_size = self.cfg, self.rt.store, self.rt.page_size
        if req.job.params.prompt_logprobs is not None:  # P computes it all (prefill_node/prefix.py)
            self._plans.labels(PREFILL, "prompt_logprobs").inc()
            return PromptPlan(PREFILL, "prompt_logprobs")
        n_reuse = reusable_pages(req.prompt_len, page_size)
        keys = [store_key(self.rt.fingerprint, h) for h in req.page_hashes[:n_reuse]]
        index = self.rt.chain_index
        if index is not None and keys:
            # Every request passes this worker: its whole chain, as a prefill worker's lookup would.
            index.touch(keys, lookup=True)
        present, why = None, "store_off"
        held = set(req.l1_pages)
        ask = [i for i in range(n_reuse) if i not in held]
        if store is not None and store.enabled and (dc.load_prefix_from_store or dc.max_local_prefill_tokens > 0):
            found = self._present(store, [keys[i] for i in ask]) if ask else ()
            if found is None:
                why = "store_slow"
            else:
                present = [False] * n_reuse
                for i, ok in zip(ask, found):
                    present[i] = ok
        # n > 1: P samples every sequence's first token from one prefill, so no local plan
        local_tokens = dc.max_local_prefill_tokens if req.job.params.n == 1 else 0
        plan = plan_prompt(present, req.prompt_len, page_size, local_tokens, dc.load_prefix_from_store,
                           req.l1_pages, why)
        self._plans.labels(plan.where, plan.reason).inc()
        return plan

    def _present(self, store: KVStore, keys: list[str]) -> tuple[bool, ...] | None:
        """store.present(keys) within PROBE_TIMEOUT_S; None when the store did not answer in time."""
        with self._lock:
            if self._probing >= PROBE_MAX_OUTSTANDING:
                return None
            self._probing += 1

        def probe() -> tuple[bool, ...]:
            try:
                return store.present(keys)
            finally:
                with self._lock:
                    self._probing -= 1

        try:
            return self._probes.submit(probe).result(timeout=PROBE_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            return None

    def close(self) -> None:
        self._probes.shutdown(wait=False, cancel_futures=True)
