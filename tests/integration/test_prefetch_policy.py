"""prefill.prefetch_policy against a real mooncake_master that stops answering (SIGSTOP, always
SIGCONT in a finally): `timeout` answers within its budget plus a forward, `best_effort` does not
wait at all when nothing else computes, `wait_complete` (the control) waits for the store. Greedy
output equals the uncached run; once the master goes on, the pages of the loads given up on enter
L1 or are freed (metric), and every pool is whole again.

Cluster: tiny model, one decode worker that never touches the store (only the prefill workers'
loads meet the stalled master), one prefill worker per policy.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time

import pytest

from pdorch.local_stack.workers import start_cluster
from pdorch.local_stack.workers import worker_metric as metric
from pdorch.worker.prompt_pages import reusable_pages
from tests.fixtures.threads import in_thread

PAGE_SIZE = 16
PAGES = 12
BASE_S, PER_PAGE_S = 0.5, 0.02  # the timeout policy's budget: 0.74 s for 12 pages
FORWARD_ALLOWANCE_S = 3.0  # one prefill of ~200 tokens + the push + gRPC, generous on a busy 2-core machine
CONTROL_WAIT_S = 5.0  # wait_complete is still waiting this long after the master stopped
LATE = "pdorch_prefill_prefetch_late_pages_total"


@pytest.fixture(scope="module")
def policies(tmp_path_factory, tiny_model_dir):
    """(cluster, {policy: its prefill worker})."""
    c = start_cluster(tmp_path_factory.mktemp("prefetch"), tiny_model_dir, with_store=True,
                      decode={"offload_generated_kv": False, "load_prefix_from_store": False,
                              "max_local_prefill_tokens": 0, "prefix_cache": False})
    try:
        by_policy = {"wait_complete": c.prefill}
        for name in ("timeout", "best_effort"):
            by_policy[name] = c.spawn_worker("prefill", prefetch_policy=name, prefetch_timeout_base_s=BASE_S,
                                               prefetch_timeout_per_page_s=PER_PAGE_S)
        c.wait_ready(*by_policy.values())
        for wp in by_policy.values():  # NOTE: the first push to D looks D up in the master's metadata
            c.generate([5, 6, 7], max_tokens=1, prefill_address=wp.address)
        yield c, by_policy
    finally:
        c.stop()


def stored_prompt(cluster, seed: int) -> tuple[list[int], list[int]]:
    """A prompt whose full pages the store holds and no L1 does, and its uncached greedy output."""
    rng = random.Random(seed)
    prompt = [rng.randrange(5, 250) for _ in range(PAGES * PAGE_SIZE + 5)]
    uncached = cluster.generate(prompt, max_tokens=6).token_ids  # computed and written back by wait_complete's P
    cluster.flush_l1()
    return prompt, uncached


@contextlib.contextmanager
def master_stopped(cluster):
    pid = cluster.master.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def timed_generate(cluster, prompt, wp):
    t0 = time.monotonic()
    res = cluster.generate(prompt, max_tokens=6, prefill_address=wp.address, timeout_s=60.0)
    return res, time.monotonic() - t0


def generate_within(cluster, prompt, wp, bound_s: float):
    """timed_generate, waited for at most bound_s (the master stays stopped no longer than that)."""
    t, box = in_thread(timed_generate, cluster, prompt, wp)
    t.join(bound_s)
    assert "result" in box, f"no answer within {bound_s:.1f} s: {box}"
    return box["result"]


def wait_late_settled(wp, pages: int, timeout_s: float = 60.0) -> float:
    """Until `pages` late pages were settled (entered L1 or freed); returns the entered_l1 count."""
    deadline = time.monotonic() + timeout_s
    while metric(wp, LATE) < pages:
        assert time.monotonic() < deadline, f"late pages settled: {metric(wp, LATE)} of {pages}"
        time.sleep(0.1)
    assert metric(wp, LATE) == pages
    return metric(wp, LATE, outcome="entered_l1")


def test_timeout_answers_within_its_budget_and_settles_the_late_pages_once_the_store_is_back(policies):
    cluster, by_policy = policies
    wp = by_policy["timeout"]
    prompt, uncached = stored_prompt(cluster, seed=1)
    n = reusable_pages(len(prompt), PAGE_SIZE)
    budget = BASE_S + PER_PAGE_S * n
    with master_stopped(cluster):
        res, elapsed = generate_within(cluster, prompt, wp, budget + FORWARD_ALLOWANCE_S)
    print(f"timeout policy, master stopped: {elapsed:.2f} s (budget {budget:.2f} s, {n} pages)")
    assert res.token_ids == uncached
    assert (res.cached.device, res.cached.store) == (0, 0)
    assert budget <= elapsed < budget + FORWARD_ALLOWANCE_S
    assert elapsed < cluster.cfg.store.op_timeout_s / 2
    assert metric(wp, "pdorch_prefill_prefetch_given_up_pages_total", policy="timeout") == n
    wait_late_settled(wp, n)
    cluster.assert_pools_sound()


def test_best_effort_does_not_wait_for_a_stalled_store_and_wait_complete_does(policies):
    cluster, by_policy = policies
    wp, control = by_policy["best_effort"], by_policy["wait_complete"]
    prompt, uncached = stored_prompt(cluster, seed=2)
    n = reusable_pages(len(prompt), PAGE_SIZE)
    with master_stopped(cluster):
        res, elapsed = generate_within(cluster, prompt, wp, FORWARD_ALLOWANCE_S)
        print(f"best_effort policy, master stopped: {elapsed:.2f} s")
        t, box = in_thread(timed_generate, cluster, prompt, control)
        t.join(CONTROL_WAIT_S)
        assert t.is_alive(), f"wait_complete did not wait for the stopped store: {box}"
    assert res.token_ids == uncached
    assert (res.cached.device, res.cached.store) == (0, 0)
    assert elapsed < FORWARD_ALLOWANCE_S
    assert metric(wp, "pdorch_prefill_prefetch_given_up_pages_total", policy="best_effort") == n
    t.join(60)
    assert "result" in box, box
    waited, waited_s = box["result"]
    print(f"wait_complete policy, master stopped {CONTROL_WAIT_S:.0f} s: {waited_s:.2f} s")
    assert waited.token_ids == uncached
    assert waited.cached.store == n * PAGE_SIZE  # it waited, and the store gave every page
    wait_late_settled(wp, n)
    cluster.assert_pools_sound()
