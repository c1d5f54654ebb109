"""In-flight prefix sharing on one prefill worker (prefill_node/inflight.py): requests whose prefix
another request is computing wait for its pages instead of computing them again, start as soon as
the pages they need are in L1, and report them as cached tier `inflight`. Small fakes for the model,
store and transfer (tests/unit/test_prefill_scheduler.py's), a runner that can hold each forward."""

from __future__ import annotations

import threading
import time

import pytest

from prefill_node.task import Phase
from tests.unit.test_prefill_scheduler import FakeRunner, abort, make, settle, submit

PROMPT = list(range(100, 124))  # 24 tokens: pages 0-4 reusable (20 tokens), page 5 holds the last token


class GatedRunner(FakeRunner):
    """Each forward waits until the test lets one through (`step()`). NOTE: the scheduler thread waits
    inside the next forward meanwhile, so the test reads its state directly (sched.call would wait)."""

    def __init__(self):
        super().__init__()
        self.gate = threading.Semaphore(0)
        self.forwards = 0

    def forward(self, chunks):
        assert self.gate.acquire(timeout=10), "a forward waited for the test for 10 s"
        self.forwards += 1
        return super().forward(chunks)

    def step(self, n: int = 1) -> None:
        for _ in range(n):
            self.gate.release()


def computed_tokens(runner) -> int:
    return sum(len(c.token_ids) for c in runner.chunks)


def waits(sched, outcome: str) -> float:
    return sched._admission.inflight.metrics.waits.labels(outcome)._value.get()


@pytest.mark.parametrize("share", [True, False])
def test_identical_prompts_sent_at_once_compute_the_prefix_once(share):
    """Three identical prompts arrive together; one page a forward. Shared: the prefix is computed once
    and the two duplicates compute only their last page, reporting 20 tokens as cached `inflight`;
    the first tokens are the same. Off: each computes all 24 tokens."""
    sched, rt, _ = make(num_pages=32, chunk_tokens=4, start=False, share_inflight_prefix=share)
    try:
        tasks = [submit(sched, PROMPT, rid) for rid in "abc"]
        sched.start()
        results = [t.future.result(10) for t in tasks]
        assert {r.first_token_id for r in results} == {3}
        if share:
            assert computed_tokens(rt.runner) == 24 + 2 * 4
            assert [(r.cached.inflight, r.cached.device) for r in results] == [(0, 0), (20, 0), (20, 0)]
            assert waits(sched, "shared") == 2 and sched._admission.inflight.metrics.pages._value.get() == 10
        else:
            assert computed_tokens(rt.runner) == 3 * 24
            assert [r.cached.total for r in results] == [0, 0, 0]
        settle(sched, rt)
    finally:
        sched.stop()


def test_a_request_sharing_the_first_pages_starts_once_those_are_computed():
    """B shares A's first two pages only (A's prompt goes on with 16 other tokens): B is admitted after
    A's second forward, while A still computes, with those two pages from L1 (tier inflight)."""
    sched, rt, _ = make(num_pages=32, chunk_tokens=4, start=False)
    rt.runner = GatedRunner()
    try:
        a = submit(sched, PROMPT[:8] + list(range(500, 516)), "a")
        b = submit(sched, PROMPT[:8] + list(range(700, 708)), "b")
        sched.start()
        rt.runner.step(2)  # A's pages 0 and 1
        deadline = time.monotonic() + 5
        while not b.page_ids:
            assert time.monotonic() < deadline, "B was not admitted after the pages it needs were computed"
            time.sleep(0.01)
        assert a.phase is Phase.COMPUTING and rt.runner.forwards <= 3
        rt.runner.step(100)
        assert b.future.result(10).cached.inflight == 8 and a.future.result(10).cached.total == 0
        assert waits(sched, "shared") == 1
        settle(sched, rt)
    finally:
        rt.runner.step(100)
        sched.stop()


def test_requests_behind_a_parked_one_are_not_held_up():
    """A computes; B (A's duplicate) parks; C (another prompt) arrived after B and is admitted and
    computed while B waits."""
    sched, rt, _ = make(num_pages=32, chunk_tokens=8, start=False)
    rt.runner = GatedRunner()
    try:
        a, b, c = submit(sched, PROMPT, "a"), submit(sched, PROMPT, "b"), submit(sched, list(range(300, 306)), "c")
        sched.start()
        rt.runner.step(1)
        deadline = time.monotonic() + 5
        while not c.page_ids:
            assert time.monotonic() < deadline, "C waited behind the parked request"
            time.sleep(0.01)
        assert not b.page_ids  # B still parked
        rt.runner.step(100)
        for t in (a, b, c):
            t.future.result(10)
        assert b.future.result().cached.inflight == 20
        settle(sched, rt)
    finally:
        rt.runner.step(100)
        sched.stop()


def test_a_parked_request_computes_the_pages_itself_when_their_owner_is_aborted():
    sched, rt, _ = make(num_pages=32, chunk_tokens=4, start=False)
    rt.runner = GatedRunner()
    try:
        submit(sched, PROMPT, "a")
        b = submit(sched, PROMPT, "b")
        sched.start()
        rt.runner.step(1)  # A's page 0 only
        deadline = time.monotonic() + 5
        while len(sched._admission.inflight.parked) != 1:
            assert time.monotonic() < deadline, "B never parked"
            time.sleep(0.01)
        abort(sched, "a")
        rt.runner.step(100)
        res = b.future.result(10)
        # A computed page 0, or 0 and 1 (a forward that started before the abort was taken ends first),
        # B took those from L1 and computed the rest: no token computed twice
        assert res.cached.inflight in (4, 8) and res.cached.device == 0
        assert computed_tokens(rt.runner) == 24
        assert waits(sched, "shared") == 1  # some of what it waited for arrived
        settle(sched, rt)
    finally:
        rt.runner.step(100)
        sched.stop()


def test_an_admitted_request_claims_the_pages_it_computes_until_its_compute_ends():
    """The claims routers see (pdorch/worker/kv_events.py inflight_claimed): the reusable pages L1
    lacked, claimed at admission and released once computed; a second request that finds them in L1
    claims nothing."""
    from store_client.page_hash import page_hashes

    sched, rt, _ = make(num_pages=32, chunk_tokens=8, start=False)
    events: list[tuple[str, list[str]]] = []
    sched.publish_claims(lambda h: events.append(("claimed", list(h))), lambda h: events.append(("released", list(h))))
    try:
        sched.start()
        submit(sched, PROMPT, "a").future.result(10)
        settle(sched, rt)
        reusable = page_hashes(PROMPT, 4)[:5]
        assert events == [("claimed", reusable), ("released", reusable)]
        submit(sched, PROMPT, "b").future.result(10)
        settle(sched, rt)
        assert len(events) == 2
    finally:
        sched.stop()
