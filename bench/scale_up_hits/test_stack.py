"""Scale-up and the hit rate on the real local stack (tiny model; bench/scale_up_hits/stack.py: etcd
discovery, a mooncake_master, a store peer, a LocalFleet, the router with its default cache-aware
policy). A 1+1 fleet serves conversations, grows to 2+2, then:

    1. the conversations that were running keep their prefixes where they are: at equal load their
       next turns go to the warm prefill worker (none to the new one) and read their previous turns
       from its own cache (L1 tiers, not the store)
    2. new conversations sent together reach the new prefill worker (the warm one is busier), and
       their next turns hit too

bench/scale_up_hits measures the same against a fixed 2+2 fleet (docs/benchmarks.md).
"""

from __future__ import annotations

import concurrent.futures
import time

import pytest

from bench.scale_up_hits.run import L1_TIERS, generate
from bench.scale_up_hits.stack import FleetStack

PAGE = 16
OLD, NEW = 4, 8


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_model_dir):
    with FleetStack(tiny_model_dir, 1, 1, log_dir=tmp_path_factory.mktemp("scale_up"),
                    say=lambda m: print(m, flush=True)) as s:
        yield s


def first_turn(c: int) -> list[int]:
    return [1000 + 37 * c + i for i in range(48)]  # 3 full pages, distinct per conversation


def l1_cached(reply: dict) -> int:
    tiers = reply["meta_info"]["cached_tokens_details"]
    return sum(tiers.get(t, 0) for t in L1_TIERS)


def prefill_routed(stack) -> dict[str, int]:
    return {w["address"]: w["routed"] for w in stack.workers() if w["role"] == "prefill"}


def wait_idle(stack, timeout_s: float = 10.0) -> None:
    """Every prefill worker idle as the router weighs it: nothing in flight, and its published load
    (KV events) 0 with nothing routed since: the policy then sees equal loads."""
    deadline = time.monotonic() + timeout_s
    while True:
        ws = [w for w in stack.workers() if w["role"] == "prefill"]
        if all(w["in_flight"] == 0 and (w.get("kv_events") or {}).get("published_load") == 0
               and (w.get("kv_events") or {}).get("routed_since_batch") == 0 for w in ws):
            return
        assert time.monotonic() < deadline, f"prefill workers not idle: {ws}"
        time.sleep(0.05)


def next_turn(prompt: list[int], reply: dict) -> list[int]:
    return prompt + reply["output_ids"] + [7, 8, 9]


def test_after_the_join_warm_conversations_stay_and_new_ones_reach_the_new_worker(stack):
    url = stack.router.url
    prompts = {c: first_turn(c) for c in range(OLD)}
    for c in range(OLD):  # before the join: everything on the one prefill worker
        prompts[c] = next_turn(prompts[c], generate(url, prompts[c], 4))
    old_worker = set(prefill_routed(stack))
    stack.scale(2, 2)
    new_worker = set(prefill_routed(stack)) - old_worker
    assert len(new_worker) == 1, prefill_routed(stack)
    (new,) = new_worker

    # 1. continuing conversations, one at a time at equal load: they stay where their prefix is
    before = prefill_routed(stack)
    for c in range(OLD):
        wait_idle(stack)
        reply = generate(url, prompts[c], 4)
        computed = (len(prompts[c]) - 3) // PAGE * PAGE  # the previous turn's full pages
        assert l1_cached(reply) >= computed, (c, reply["meta_info"])
        prompts[c] = next_turn(prompts[c], reply)
    assert prefill_routed(stack)[new] == before[new], f"a warm conversation went to the cold worker: {prefill_routed(stack)}"

    # 2. new conversations, sent together: the new worker takes its part of them
    before = prefill_routed(stack)
    fresh = {c: first_turn(c) for c in range(OLD, OLD + NEW)}
    with concurrent.futures.ThreadPoolExecutor(NEW) as pool:
        replies = dict(zip(fresh, pool.map(lambda c: generate(url, fresh[c], 4), fresh)))
    got = {a: n - before[a] for a, n in prefill_routed(stack).items()}
    assert got[new] > 0 and sum(got.values()) == NEW, got
    with concurrent.futures.ThreadPoolExecutor(NEW) as pool:  # their next turns hit (L1 or the store)
        seconds = list(pool.map(lambda c: generate(url, next_turn(fresh[c], replies[c]), 4), fresh))
    assert all(r["meta_info"]["cached_tokens"] >= 48 for r in seconds), [r["meta_info"] for r in seconds]
