"""prefill.prefetch_policy (prefill_node/prefetch.py) with the scheduler's small fakes: a request
that stops waiting for its store load computes those pages in fresh pages (never in the pages the
load still writes), which the load's completion settles; the pool stays whole."""

from __future__ import annotations

import concurrent.futures
import time

import pytest

from engine.sampling_params import SamplingParams
from pdorch.worker.prefill_rpc import PrefillJob
from prefill_node.prefetch import BEST_EFFORT, TIMEOUT, WAIT_COMPLETE
from prefill_node.task import PrefillTask
from store_client.page_hash import page_hashes, store_key
from tests.fixtures.runtime import PAGE_NBYTES
from tests.unit.test_prefill_scheduler import (
    PAGE_SIZE,
    FakeStoreIO,
    make,
    settle,
    submit,
)

TOKENS = list(range(70, 83))  # 13 tokens: pages 0-2 full and reusable, page 3 holds the tail
KEYS = [store_key("fp", h) for h in page_hashes(TOKENS, PAGE_SIZE)]


def metric(sched, name: str, **labels) -> float:
    return sched._rec.registry.get_sample_value(name, labels) or 0.0


def policy(name: str, base_s: float = 1.0, per_page_s: float = 0.004) -> dict:
    """The `prefill.prefetch_*` keys of a policy."""
    return {"prefetch_policy": name, "prefetch_timeout_base_s": base_s, "prefetch_timeout_per_page_s": per_page_s}


def held_load(prefetch: dict, num_pages: int = 8):
    """A scheduler whose store holds TOKENS' pages and answers no load until io.release()."""
    io = FakeStoreIO(present=KEYS)
    io.hold.set()
    sched, rt, _ = make(num_pages=num_pages, store_io=io, **prefetch)
    return sched, rt, io


def load_pages(io) -> set[int]:
    """The pool pages the (only) store load writes."""
    return {(a - 1000) // PAGE_NBYTES for a in io.load_addrs[0]}


@pytest.mark.parametrize("prefetch", [policy(TIMEOUT, base_s=0.3, per_page_s=0.0), policy(BEST_EFFORT)],
                         ids=lambda p: p["prefetch_policy"])
def test_a_stalled_load_given_up_is_computed_in_fresh_pages_and_its_pages_come_back_when_it_lands(prefetch):
    name = prefetch["prefetch_policy"]
    sched, rt, io = held_load(prefetch)
    try:
        t0 = time.monotonic()
        res = submit(sched, TOKENS).future.result(5)
        elapsed = time.monotonic() - t0
        if name == TIMEOUT:
            assert elapsed >= 0.3  # it waited its budget
        assert (res.cached.device, res.cached.store) == (0, 0)  # computed, not cached
        old = load_pages(io)
        assert len(old) == 3
        computed_in = {p for c in rt.runner.chunks for p in c.page_ids}
        assert not computed_in & old, "the forward used pages the store load still writes"
        assert sched.call(lambda: [rt.allocator.ref_count(p) for p in sorted(old)]) == [1, 1, 1]  # the load's
        assert metric(sched, "pdorch_prefill_prefetch_given_up_pages_total", policy=name) == 3
        assert metric(sched, "pdorch_prefill_hole_pages_recomputed_total") == 0  # given up on, not holes
        io.release()  # the load lands: the computed pages hold the hashes already, so its pages are freed
        settle(sched, rt)
        assert sched.call(lambda: rt.allocator.num_available()) == 8
        assert metric(sched, "pdorch_prefill_prefetch_late_pages_total", outcome="freed") == 3
        assert metric(sched, "pdorch_prefill_prefetch_late_pages_total", outcome="entered_l1") == 0
        assert sched.call(lambda: rt.allocator.num_cached()) == 3  # the computed pages
    finally:
        sched.stop()


def test_wait_complete_waits_for_the_load_and_uses_it():
    sched, rt, io = held_load(policy(WAIT_COMPLETE))
    try:
        task = submit(sched, TOKENS)
        with pytest.raises(concurrent.futures.TimeoutError):
            task.future.result(0.5)
        io.release()
        res = task.future.result(5)
        assert res.cached.store == 3 * PAGE_SIZE
        settle(sched, rt)
        assert metric(sched, "pdorch_prefill_prefetch_given_up_pages_total", policy=TIMEOUT) == 0
    finally:
        sched.stop()


def test_without_fresh_pages_to_spare_the_request_keeps_waiting_rather_than_drop_pages():
    sched, rt, io = held_load(policy(TIMEOUT, base_s=0.05, per_page_s=0.0), num_pages=4)  # 4 = the prompt
    try:
        task = submit(sched, TOKENS)
        with pytest.raises(concurrent.futures.TimeoutError):
            task.future.result(0.5)  # 10x its budget
        assert metric(sched, "pdorch_prefill_prefetch_given_up_pages_total", policy=TIMEOUT) == 0
        io.release()
        assert task.future.result(5).cached.store == 3 * PAGE_SIZE
        settle(sched, rt)
        assert sched.call(lambda: rt.allocator.num_available()) == 4
    finally:
        sched.stop()


def test_late_pages_enter_l1_only_under_a_hash_no_other_page_holds():
    sched, rt, _ = make(num_pages=8, store_io=FakeStoreIO(), start=False, prefetch_policy=TIMEOUT)
    admission = sched._admission
    alloc = rt.allocator
    job = PrefillJob("r", tuple(TOKENS), SamplingParams(), "seg", (0,) * 4, 10.0, PAGE_SIZE, "fp")
    task = PrefillTask(job=job, deadline=time.monotonic() + 10)
    task.prefix.hashes = ["h0", "h1", "h2"]
    late = alloc.allocate(3)
    task.load.late = list(enumerate(late))
    other = alloc.allocate(1)[0]
    alloc.cache("h1", other)  # e.g. the page the task computed instead
    admission._settle_late(task, (True, True, False))  # h2 did not arrive
    assert alloc.lookup(["h0", "h1", "h2"]) == [late[0], other, None]
    assert alloc.is_persisted(late[0])
    alloc.release([late[0], other, other])
    alloc.check_integrity()
    assert alloc.num_available() == 8 and task.load.late == []
    assert admission.prefetch_metrics.late.labels("entered_l1")._value.get() == 1
    assert admission.prefetch_metrics.late.labels("freed")._value.get() == 2
