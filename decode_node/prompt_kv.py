"""Where a prompt's KV comes from on the decode worker: its own prefix cache, the store (read by D
itself), a prefill worker, or D's own forward (conditional disaggregation). Decided per request,
before P is called:

    held    = reusable pages found in D's own prefix cache at admission (decode_node/admission.py)
    present = store.present(keys of the other reusable pages)   one batch_is_exist (~1 ms)
    left    = prompt tokens in neither (holes + tail)

    held or present, left <= decode.max_local_prefill_tokens -> local:   D reads the present pages and
                                                                         computes the rest in its batch
    otherwise                                                -> prefill: P computes; it pushes neither
          the held pages nor (with decode.load_prefix_from_store) the present ones, which D reads
          WHILE P works; P may read the held pages from D's pool for its own attention

A page D fails to read after all (evicted since the check) D computes itself: it costs only itself.
NOTE: the existence check takes a read lease on the pages it finds (mooncake.md); they are the
pages read right after, by D and by P.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from prometheus_client import Counter

from decode_node.messages import PrefixRead
from decode_node.request import DecodeRequest
from pdorch.worker.errors import PeerFailed
from pdorch.worker.prompt_pages import compute_ranges, reusable_pages
from pdorch.worker.protocol import CachedTokens
from store_client.page_hash import store_key

LOAD_GRACE_S = 2.0  # D waits this long past its bound for its own store read before abandoning it
LOCAL = "local"
PREFILL = "prefill"
# Why: store_off (no store), store_slow (the existence check did not answer in time), no_prefix
# (no reusable page in the store nor in D's prefix cache), local_off (threshold 0), long_tail (more
# left than the threshold), short_tail (local).
REASONS = {LOCAL: ("short_tail",), PREFILL: ("store_off", "store_slow", "no_prefix", "local_off", "long_tail")}
PROBE_TIMEOUT_S = 0.25  # a batch_is_exist takes ~1 ms; past this the store is stalled: go without it
PROBE_THREADS = 4
PROBE_MAX_OUTSTANDING = 64  # more checks than this unanswered: the store is stalled, do not queue more


@dataclass(frozen=True)
class PromptPlan:
    where: str  # LOCAL or PREFILL
    reason: str
    load: tuple[int, ...] = ()  # reusable page indexes D reads from the store itself
    held: tuple[int, ...] = ()  # reusable page indexes D's own prefix cache holds

    @property
    def local(self) -> bool:
        return self.where == LOCAL


def plan_prompt(present: Sequence[bool] | None, prompt_len: int, page_size: int, max_local_tokens: int,
                load_prefix: bool, held: Sequence[int] = (), store_reason: str = "store_off") -> PromptPlan:
    """`present`: per reusable page, in the store (None: the store is off or unusable, then
    `store_reason` says why); `held`: the reusable pages D's own prefix cache holds."""
    held = tuple(sorted(held))
    skip = set(held)
    found = tuple(i for i, ok in enumerate(present or ()) if ok and i not in skip)
    if not found and not held:
        return PromptPlan(PREFILL, store_reason if present is None else "no_prefix")
    left = prompt_len - (len(found) + len(held)) * page_size
    if max_local_tokens <= 0:
        return PromptPlan(PREFILL, "local_off", found if load_prefix else (), held)
    if left > max_local_tokens:
        return PromptPlan(PREFILL, "long_tail", found if load_prefix else (), held)
    return PromptPlan(LOCAL, "short_tail", found, held)


def computed_full_pages(holes: Sequence[int], prompt_len: int, page_size: int) -> list[int]:
    """Full prompt pages a local prefill computes: the holes, then the tail's full page(s). The page
    holding the last token is computed too but is full only when the prompt fills it exactly.

        prompt_len=32, page_size=16: reusable [0], tail = page 1 (full)      -> holes + [1]
        prompt_len=40, page_size=16: reusable [0, 1], tail = page 2 (8/16)   -> holes
    """
    return sorted(holes) + list(range(reusable_pages(prompt_len, page_size), prompt_len // page_size))


@dataclass(eq=False)
class PrefixLoad:
    """D's own store read of some prompt pages, on the store I/O thread. The scheduler thread gets
    the completion and hands it to `future` (IOCompletion) unless the handler abandoned the read
    (cancelled the future): then the scheduler frees `page_ids` itself, once Mooncake is done
    writing into them."""

    pages: tuple[int, ...]  # indexes into the request's page_ids
    page_ids: tuple[int, ...]
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)

    def page_ok(self, done) -> tuple[bool, ...]:
        ok = tuple(done.page_ok)
        return ok + (False,) * (len(self.pages) - len(ok))


class PromptKV:
    """The decode worker's side of the plan: the existence check, its own store read, and what is
    left for its scheduler to compute (handler threads; the allocator stays the scheduler's)."""

    def __init__(self, rt, cfg, reg, count_loaded=lambda n: None):
        """`count_loaded(n)`: the worker's own count of store pages read (its Stats' store_pages_loaded)."""
        self.rt, self.cfg = rt, cfg
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

    def plan(self, req: DecodeRequest) -> PromptPlan:
        """Where the prompt KV comes from, counted by decision and reason."""
        dc, store, P = self.cfg.decode, self.rt.store, self.cfg.model.page_size
        n_reuse = reusable_pages(req.prompt_len, P)
        keys = [store_key(self.rt.fingerprint, h) for h in req.page_hashes[:n_reuse]]
        index = getattr(self.rt, "chain_index", None)
        if index is not None and keys:
            # Every request passes this worker: its whole chain, as a prefill worker's lookup would.
            index.touch(keys, lookup=True)
        present, why = None, "store_off"
        held = set(req.l1_pages)
        ask = [i for i in range(n_reuse) if i not in held]
        if store is not None and store.enabled and (dc.load_prefix_from_store or dc.max_local_prefill_tokens > 0):
            found = self._present([keys[i] for i in ask]) if ask else ()
            if found is False:
                why = "store_slow"
            else:
                present = [False] * n_reuse
                for i, ok in zip(ask, found):
                    present[i] = ok
        plan = plan_prompt(present, req.prompt_len, P, dc.max_local_prefill_tokens, dc.load_prefix_from_store,
                           req.l1_pages, why)
        self._plans.labels(plan.where, plan.reason).inc()
        return plan

    def _present(self, keys: list[str]) -> tuple[bool, ...] | bool:
        """store.present(keys) within PROBE_TIMEOUT_S; False when the store did not answer in time."""
        with self._lock:
            if self._probing >= PROBE_MAX_OUTSTANDING:
                return False
            self._probing += 1

        def probe():
            try:
                return self.rt.store.present(keys)
            finally:
                with self._lock:
                    self._probing -= 1

        try:
            return self._probes.submit(probe).result(timeout=PROBE_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            return False

    def close(self) -> None:
        self._probes.shutdown(wait=False, cancel_futures=True)

    def start_load(self, req: DecodeRequest, pages: tuple[int, ...]) -> PrefixLoad | None:
        """D's own store read of `pages` (prompt page indexes) into its pages, on the I/O thread."""
        if not pages:
            return None
        load = PrefixLoad(pages, tuple(req.page_ids[i] for i in pages))
        keys = [store_key(self.rt.fingerprint, req.page_hashes[i]) for i in pages]
        self.rt.store_io.submit_load(PrefixRead(load), keys, self.rt.pool.page_addrs(list(load.page_ids)))
        return load

    def finish_load(self, req: DecodeRequest, load: PrefixLoad | None) -> tuple[bool, ...]:
        """Wait for D's own store read: per page, whether it landed (see settle_load for the bound)."""
        if load is None:
            return ()
        ok = self.settle_load(req, load)
        if ok is None:
            raise PeerFailed(f"request {req.request_id}: the store read of its prefix did not finish within "
                             f"{self.cfg.store.op_timeout_s:g} s (store.op_timeout_s; the store is stalled)")
        self._loaded_pages.labels("loaded").inc(sum(ok))
        self._loaded_pages.labels("failed").inc(len(ok) - sum(ok))
        self._count_loaded(sum(ok))
        return ok

    def settle_load(self, req: DecodeRequest, load: PrefixLoad | None) -> tuple[bool, ...] | None:
        """The read's page_ok, or None when it was abandoned (past the deadline or store.op_timeout_s,
        whichever comes first, plus a grace): its pages then leave req.page_ids and the scheduler
        frees them once Mooncake has stopped writing into them."""
        if load is None:
            return ()
        if load.future.cancelled():  # abandoned before (its pages already left req.page_ids)
            return None
        # NOTE: StoreIO completes a load queued past store.op_timeout_s without running it; a running
        # one ends when Mooncake answers, which a stalled store may never do.
        wait_s = min(max(0.0, req.deadline - time.monotonic()), self.cfg.store.op_timeout_s) + LOAD_GRACE_S
        try:
            return load.page_ok(load.future.result(timeout=wait_s))
        except concurrent.futures.TimeoutError:
            if not load.future.cancel():  # being answered right now
                return load.page_ok(load.future.result(timeout=LOAD_GRACE_S))
            gone = set(load.page_ids)
            req.page_ids = [p for p in req.page_ids if p not in gone]
            return None

    def compute_here(self, req: DecodeRequest, plan: PromptPlan, ok: tuple[bool, ...], first_pending: bool) -> None:
        """What D computes itself before decoding: locally, every page but those it holds or read (and
        the first token); after P, only the pages it meant to read but could not."""
        P, n = self.cfg.model.page_size, req.prompt_len
        read = {i for i, good in zip(plan.load, ok) if good}
        if first_pending:
            have = read | set(plan.held)
            holes = [i for i in range(reusable_pages(n, P)) if i not in have]
            req.todo = compute_ranges(holes, n, P)
            req.computed_pages = computed_full_pages(holes, n, P)
            req.cached = CachedTokens(device=len(plan.held) * P, store=len(read) * P)
            req.first_pending = True
            return
        holes = [i for i in plan.load if i not in read]
        req.todo = [[i * P, (i + 1) * P] for i in holes]
        req.computed_pages = holes
