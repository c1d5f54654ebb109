"""Preemption on the decode scheduler (decode_node/preemption.py) with the tiny random-weights model:
streams that together outgrow the pool all complete, each equal to the same request served alone,
their KV restored from the prefix cache or the store exactly as it was; no page leaks over a hundred
preempt/resume cycles; a preempted request that is aborted or expires gives its pages back.

Each request computes its own prompt KV here (a local prefill), so its tokens depend only on its
prompt and sampling, never on what an earlier test left in the pool. The store is a small stand-in
that really keeps page copies (the real Mooncake store: tests/integration/test_decode_preemption.py).
"""

from __future__ import annotations

import concurrent.futures
import time

import pytest
import torch

from decode_node.growth import CLIP_TOKENS, GrowthReserve, growth_pages
from decode_node.preemption import choose_victim
from decode_node.request import DecodeRequest, GenerateJob
from decode_node.stopping import make_stopper
from engine.page_allocator import pages_for
from engine.sampling_params import SamplingParams
from pdorch.local_stack.router import wait_until
from pdorch.worker.prompt_pages import compute_ranges, computed_full_pages, reusable_pages
from store_client.io_thread import IOCompletion
from store_client.page_hash import page_hashes
from tests.unit.test_decode_scheduler import HeldStoreIO, events_until_final, load_tiny, start_scheduler

PAGE_SIZE = 16
GREEDY = {"temperature": 0.0}
SEEDED = {"temperature": 0.9, "top_k": 50, "seed": 1234}


@pytest.fixture(scope="module")
def model(tmp_path_factory, tiny_model_dir):
    return load_tiny(tmp_path_factory.mktemp("decode_preempt"), tiny_model_dir)


class PageStore(HeldStoreIO):
    """StoreIO stand-in that keeps a copy of every page saved, by key, and loads it back; each
    submission completes at the scheduler's next iteration (as StoreIO's completions do)."""

    def __init__(self):
        super().__init__()
        self.pages: dict[str, torch.Tensor] = {}
        self._pool = None
        self._page_of: dict[int, int] = {}

    def bind(self, pool) -> PageStore:
        self._pool = pool
        self._page_of = {addr: i for i, addr in enumerate(pool.page_addrs(range(pool.tensor.shape[0])))}
        return self

    def submit_save(self, tag, keys, addrs, owners=None):
        for key, addr in zip(keys, addrs):
            self.pages.setdefault(key, self._pool.tensor[self._page_of[addr]].clone())
        self._complete(tag, "save", (True,) * len(keys))
        return True

    def submit_load(self, tag, keys, addrs, deadline_s=None):
        ok = []
        for key, addr in zip(keys, addrs):
            if key in self.pages:
                self._pool.tensor[self._page_of[addr]].copy_(self.pages[key])
            ok.append(key in self.pages)
        self._complete(tag, "load", tuple(ok))

    def _complete(self, tag, op, ok):
        self.done.append(IOCompletion(tag, op, sum(ok), "ok", len(ok), page_ok=ok))
        self.on_complete()


class KVSpy:
    """Keeps a victim's KV (positions 0 .. L-2) when it is preempted and compares it with what its
    pages hold once it resumed (both on the scheduler thread)."""

    def __init__(self, sched, rt):
        self.differences: list[float] = []  # per resume: the largest absolute difference
        pre, kept = sched.preemption, {}
        preempt, resumed = pre.preempt, pre.resumed

        def kv(req):
            n = len(req.token_ids) - 1
            t = rt.pool.tensor[req.page_ids]  # [pages, heads, layers, 2, page_size, head_dim]
            return t.permute(1, 2, 3, 0, 4, 5).flatten(3, 4)[:, :, :, :n].clone()

        def spy_preempt(req, now):
            kept[req] = kv(req)
            preempt(req, now)

        def spy_resumed(req, now):
            resumed(req, now)
            self.differences.append(float((kv(req) - kept.pop(req)).abs().max()))

        pre.preempt, pre.resumed = spy_preempt, spy_resumed


def joined(sched, tokenizer, rid: str, prompt: list[int], max_tokens: int, sampling: dict) -> DecodeRequest:
    """A request as the decode worker runs a local one: admitted (waiting for pages), its whole
    prompt KV to compute here, in the batch."""
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, **sampling)
    job = GenerateJob(request_id=rid, token_ids=tuple(prompt), params=params, prefill_address="-", timeout_s=60)
    req = DecodeRequest(job=job, deadline=time.monotonic() + 60, own_deadline=True,
                        stopper=make_stopper(tokenizer, params, prompt), token_ids=list(prompt),
                        generator=sched._rt.sampler.make_generator(params))
    n = len(prompt)
    req.page_hashes = page_hashes(prompt, PAGE_SIZE)
    sched.admit_request(req, pages_for(n + 1, PAGE_SIZE), 0, lambda: False)
    holes = list(range(reusable_pages(n, PAGE_SIZE)))
    req.compute.plan(compute_ranges(holes, n, PAGE_SIZE), computed_full_pages(holes, n, PAGE_SIZE),
                     sample_first=True)
    sched.join(req)
    return req


def serve(sched, tokenizer, rid: str, prompt: list[int], max_tokens: int, sampling: dict) -> list[int]:
    """One request through the scheduler (joined()), decoded to the end; its generated tokens."""
    req = joined(sched, tokenizer, rid, prompt, max_tokens, sampling)
    n = len(prompt)
    events = events_until_final(req, 60)
    assert events[-1].error is None and events[-1].finish_reason == "length", events[-1]
    out = [t for e in events for t in e.token_ids]
    assert out == req.token_ids[n:]  # every token streamed once, in order
    paused = [i for i, e in enumerate(events) if e.paused]
    # the stream is told of each preemption at once, by an event of its own with no tokens ...
    assert sum(e.preemptions for e in events) == len(paused) == req.preempt.count
    assert all(events[i].preemptions == 1 and not events[i].token_ids for i in paused)
    # ... and of how long it paused by the next event (the first after the resume)
    assert all(events[i + 1].paused_s > 0 and not events[i + 1].paused for i in paused)
    assert sum(1 for e in events if e.paused_s) == len(paused)
    return out


def prompt(n: int, seed: int) -> list[int]:
    return [(seed * 7919 + i * 31) % 1000 + 10 for i in range(n)]


def run_together(sched, tokenizer, prompts, max_tokens: int, sampling: dict) -> list[list[int]]:
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        futures = [pool.submit(serve, sched, tokenizer, f"r{i}", p, max_tokens, sampling)
                   for i, p in enumerate(prompts)]
        return [f.result(timeout=120) for f in futures]


def resumed_tokens(sched, source: str) -> float:
    return sched._rec.registry.get_sample_value("pdorch_decode_resumed_tokens_total", {"source": source})


def settled(sched, rt, num_pages: int) -> None:
    """Every page back once offload writes drained; the pool's invariants hold."""
    wait_until(lambda: sched.call(rt.allocator.num_available) == num_pages, 10, "pages never came back")
    sched.call(rt.allocator.check_integrity)


PROMPTS = [prompt(40, seed) for seed in range(3)]
MAX_TOKENS = 60  # 100 tokens = 7 pages each when they end: 21 pages wanted, the pool below has 12


@pytest.fixture(scope="module")
def alone(model):
    """Each request served alone in a pool that holds it (no preemption), per sampling."""
    sched, _ = start_scheduler(model, 64)
    try:
        return {name: [serve(sched, model[3], f"alone-{name}-{i}", p, MAX_TOKENS, sampling)
                       for i, p in enumerate(PROMPTS)]
                for name, sampling in (("greedy", GREEDY), ("seeded", SEEDED))}
    finally:
        sched.stop()


@pytest.mark.parametrize("sampling", ["greedy", "seeded"])
@pytest.mark.parametrize("kept_by", ["store", "cache"])
def test_streams_that_outgrow_the_pool_complete_equal_to_each_served_alone(model, alone, sampling, kept_by):
    num_pages = 12
    store = PageStore() if kept_by == "store" else None
    # store: no prefix cache, every full page comes back from the store; cache: no store at all
    sched, rt = start_scheduler(model, num_pages, store_io=store, prefix_cache=kept_by == "cache",
                                preemption=True)
    try:
        if store is not None:
            store.bind(rt.pool)
        spy = KVSpy(sched, rt)
        got = run_together(sched, model[3], PROMPTS, MAX_TOKENS, GREEDY if sampling == "greedy" else SEEDED)
        assert got == alone[sampling]
        assert sched.preemption.total >= 1 and len(spy.differences) == sched.preemption.total
        assert resumed_tokens(sched, kept_by) > 0
        if kept_by == "store":  # restored bit for bit: the store's copy and the kept partial page
            assert resumed_tokens(sched, "recomputed") == 0 and max(spy.differences) == 0.0
        else:  # what the prefix cache lost was computed again: equal within float error
            assert max(spy.differences) < 1e-4
        settled(sched, rt, num_pages)
    finally:
        sched.stop()


def test_a_hundred_preempt_resume_cycles_leak_no_page(model):
    num_pages = 5
    store = PageStore()
    sched, rt = start_scheduler(model, num_pages, store_io=store, prefix_cache=True, preemption=True)
    try:
        store.bind(rt.pool)
        rounds = 0
        while sched.preemption.total < 100:
            rounds += 1
            assert rounds <= 60, f"only {sched.preemption.total} preemptions in {rounds} rounds"
            run_together(sched, model[3], [prompt(8, 10 * rounds + i) for i in range(4)], 40, GREEDY)
            sched.call(rt.allocator.check_integrity)
        settled(sched, rt, num_pages)
        assert sched.num_preempted == 0 and sched.num_running == 0
    finally:
        sched.stop()


@pytest.mark.parametrize("ending", ["aborted", "expired"])
def test_a_preempted_request_that_ends_gives_its_pages_back(model, ending):
    num_pages = 6
    sched, rt = start_scheduler(model, num_pages, prefix_cache=True, preemption=True)
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            old = pool.submit(serve, sched, model[3], "old", prompt(20, 1), 70, GREEDY)
            wait_until(lambda: sched.num_running == 1, 10, "the first request never ran")
            new = joined(sched, model[3], "new", prompt(20, 2), 70, GREEDY)
            # both grow to 6 pages: the newer one is preempted and waits for the older one
            wait_until(lambda: sched.num_preempted == 1, 30, "the newer request was never preempted")
            if ending == "aborted":
                new.cancelled = True
                sched.wake()
            else:
                new.deadline = time.monotonic()
            wait_until(lambda: new.done, 10, "the preempted request never ended")
            assert old.result(60)  # the older one completes
        events = []
        while not new.events.empty():
            events.append(new.events.get_nowait())
        assert events[-1].error is not None and type(events[-1].error).__name__ == (
            "Aborted" if ending == "aborted" else "DeadlineExceeded")
        settled(sched, rt, num_pages)
        assert sched.num_preempted == 0
    finally:
        sched.stop()


def test_a_request_that_alone_outgrows_the_whole_pool_still_fails(model):
    sched, rt = start_scheduler(model, 1, preemption=True)  # 1 page: positions 0..15
    try:
        req = joined(sched, model[3], "big", prompt(14, 3), 50, GREEDY)
        events = events_until_final(req)
        assert "KV pool exhausted" in str(events[-1].error) and sched.preemption.total == 0
        settled(sched, rt, 1)
    finally:
        sched.stop()


def test_the_victim_is_the_latest_arrival():
    reqs = [DecodeRequest(job=None, deadline=0.0, own_deadline=False, stopper=None, arrival=a) for a in (3, 9, 1)]
    assert choose_victim(reqs).arrival == 9


def test_the_growth_reserve_decays_without_preemptions_and_resets_at_one():
    reserve = GrowthReserve(0.7, 0.1, decay_steps=6)
    assert reserve.pages(10) == 7
    for _ in range(3):
        reserve.stepped()
    assert reserve.ratio == pytest.approx(0.4) and reserve.pages(10) == 4
    for _ in range(10):
        reserve.stepped()
    assert reserve.ratio == pytest.approx(0.1) and reserve.pages(10) == 1 and reserve.pages(0) == 0
    reserve.preempted()
    assert reserve.ratio == 0.7
    with pytest.raises(ValueError, match="floor"):
        GrowthReserve(0.1, 0.7)


def test_growth_counts_what_max_tokens_may_still_add_clipped_and_within_the_context():
    assert growth_pages(40, 60, 10_000, 3, PAGE_SIZE) == pages_for(100, PAGE_SIZE) - 3
    assert growth_pages(40, 10**6, 10**7, 3, PAGE_SIZE) == pages_for(40 + CLIP_TOKENS, PAGE_SIZE) - 3
    assert growth_pages(40, 60, 64, 3, PAGE_SIZE) == 1  # the context ends it at 64 tokens: 4 pages
    assert growth_pages(40, 1, 10_000, 3, PAGE_SIZE) == 0
