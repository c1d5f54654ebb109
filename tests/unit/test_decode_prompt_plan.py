"""Where a prompt's KV comes from on the decode worker (decode_node/prompt_plan.py, decode_node/prompt_kv.py) and the page
arithmetic it uses (pdorch/worker/prompt_pages.py): hand-computed cases."""

from __future__ import annotations

from decode_node.prompt_plan import LOCAL, PREFILL, PromptPlan, Source, plan_prompt
from pdorch.worker.prompt_pages import (
    compute_ranges,
    computed_full_pages,
    consume,
    reusable_pages,
    take_ranges,
)

PAGE_SIZE = 16


def test_without_the_store_or_a_prefix_in_it_the_prefill_worker_computes_everything():
    assert plan_prompt(None, 70, PAGE_SIZE, 256, True) == plan_prompt(None, 70, PAGE_SIZE, 256, False)
    assert (plan_prompt(None, 70, PAGE_SIZE, 256, True).where, plan_prompt(None, 70, PAGE_SIZE, 256, True).reason) == \
        (PREFILL, "store_off")
    nothing = plan_prompt((False,) * 4, 70, PAGE_SIZE, 256, True)
    assert (nothing.where, nothing.reason, nothing.load) == (PREFILL, "no_prefix", ())


def test_a_short_tail_is_computed_locally_around_the_holes():
    # 70 tokens: reusable pages 0..3 (69 // 16); page 2 missing -> left = 16 (hole) + 6 (tail) = 22
    plan = plan_prompt((True, True, False, True), 70, PAGE_SIZE, 256, True)
    assert (plan.where, plan.reason, plan.load, plan.local) == (LOCAL, "short_tail", (0, 1, 3), True)
    # exactly at the threshold is still local; one token more is not
    assert plan_prompt((True, True, False, True), 70, PAGE_SIZE, 22, True).local
    over = plan_prompt((True, True, False, True), 70, PAGE_SIZE, 21, True)
    assert (over.where, over.reason, over.load) == (PREFILL, "long_tail", (0, 1, 3))


def test_decode_reads_the_prefix_only_when_asked_to():
    assert plan_prompt((True, True, False, True), 70, PAGE_SIZE, 21, False).load == ()
    off = plan_prompt((True, True, False, True), 70, PAGE_SIZE, 0, True)
    assert (off.where, off.reason, off.load) == (PREFILL, "local_off", (0, 1, 3))
    assert plan_prompt((True,) * 4, 70, PAGE_SIZE, 0, False).load == ()


def test_ranges_and_full_pages_computed_locally():
    assert reusable_pages(70, PAGE_SIZE) == 4 and reusable_pages(64, PAGE_SIZE) == 3
    assert compute_ranges([2], 70, PAGE_SIZE) == [[32, 48], [64, 70]]
    assert compute_ranges([3], 70, PAGE_SIZE) == [[48, 70]]  # the hole runs into the tail: one range
    assert compute_ranges([], 70, PAGE_SIZE) == [[64, 70]]
    assert computed_full_pages([2], 70, PAGE_SIZE) == [2]  # page 4 holds 6 tokens: not full
    assert computed_full_pages([0], 64, PAGE_SIZE) == [0, 3]  # 64 tokens: page 3 is full and holds the last token



def _request(prompt_len: int):
    from decode_node.request import DecodeRequest, GenerateJob
    from engine.sampling_params import SamplingParams

    job = GenerateJob("r", tuple(range(prompt_len)), SamplingParams(), "-", 10.0)
    return DecodeRequest(job=job, deadline=0.0, own_deadline=True, stopper=None)


def test_the_plan_says_where_each_page_comes_from_and_leaves_the_rest_to_compute():
    # 70 tokens, reusable pages 0..3: page 0 in D's cache, 1 and 2 read from the store (2 fails)
    local = PromptPlan(LOCAL, "short_tail", load=(1, 2), held=(0,))
    assert local.sources(4) == [Source.HELD, Source.STORE, Source.STORE, Source.HERE]
    req = _request(70)
    local.apply(req, (True, False), PAGE_SIZE)
    assert (req.compute.todo, req.compute.pages, req.compute.first_pending) == ([[32, 70]], [2, 3], True)
    assert (req.cached.device, req.cached.store) == (16, 16)
    after_prefill = PromptPlan(PREFILL, "long_tail", load=(1, 2), held=(0,))
    assert after_prefill.sources(4) == [Source.HELD, Source.STORE, Source.STORE, Source.PREFILL]
    assert after_prefill.not_from_prefill() == (0, 1, 2)
    req = _request(70)
    after_prefill.apply(req, (True, False), PAGE_SIZE)  # only the page D failed to read
    assert (req.compute.todo, req.compute.pages, req.compute.first_pending) == ([[32, 48]], [2], False)

def test_taking_ranges_within_a_budget_and_consuming_them():
    todo = [[32, 48], [64, 70]]
    assert take_ranges(todo, 20) == [(32, 48), (64, 68)]
    assert take_ranges(todo, 16) == [(32, 48)]
    assert take_ranges(todo, 0) == []
    consume(todo, 48)
    assert todo == [[64, 70]]
    consume(todo, 68)
    assert todo == [[68, 70]]
    consume(todo, 70)
    assert todo == []


def test_a_stalled_store_check_plans_without_the_store_instead_of_waiting():
    import threading

    from prometheus_client import CollectorRegistry

    from decode_node.prompt_kv import PromptKV
    from decode_node.request import DecodeRequest, GenerateJob
    from engine.sampling_params import SamplingParams
    from pdorch.config import Config
    from store_client.page_hash import page_hashes
    from tests.fixtures.runtime import stand_in_runtime

    release = threading.Event()

    class FrozenStore:  # a master that never answers: batch_is_exist blocks
        enabled = True

        def present(self, keys):
            release.wait(30)
            return (True,) * len(keys)

    rt = stand_in_runtime(None, 8, PAGE_SIZE, cfg=Config())
    rt.store = FrozenStore()
    kv = PromptKV(rt, rt.cfg.decode, rt.cfg.store, CollectorRegistry())
    prompt = list(range(70))
    req = DecodeRequest(job=GenerateJob("r", tuple(prompt), SamplingParams(), "-", 10.0), deadline=0.0,
                        own_deadline=True, stopper=None, page_hashes=page_hashes(prompt, PAGE_SIZE))
    try:
        plan = kv.prepare(req)  # returns after PROBE_TIMEOUT_S, not when the store answers
        assert (plan.where, plan.reason, plan.load) == (PREFILL, "store_slow", ())
        assert not release.is_set()
    finally:
        release.set()
        kv.close()
