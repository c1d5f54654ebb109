"""Decode workers with pools of different sizes behind one router: the "never fits" 400 is decided
by the LARGEST pool, and a request only the larger pool holds is served by the worker that has it
(router/fleet/workers.py decode_fits), never sent to the smaller one to be refused there.

Cluster: one prefill and two decode worker processes (tiny random-weights model, no store), pools of
SMALL and LARGE pages of 16 tokens; the router in the test process.
"""

from __future__ import annotations

import httpx
import pytest

from pdorch.local_stack.router import cluster_router
from pdorch.local_stack.workers import start_cluster, worker_metric

SMALL, LARGE = 8, 24  # pages: 128 and 384 tokens
PROMPT = [(i * 41) % 900 + 20 for i in range(40)]


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_model_dir):
    cluster = start_cluster(tmp_path_factory.mktemp("pools"), tiny_model_dir, with_store=False,
                            decode={"num_pages": SMALL})
    router = None
    try:
        with cluster.stopped_on_failure():
            large = cluster.spawn_worker("decode", num_pages=LARGE)
            cluster.wait_ready(large)
        router = cluster_router(cluster, tiny_model_dir, policy="least_load")
        yield cluster, router, large
    finally:
        if router is not None:
            router.stop()
        cluster.stop()


def completion(router, max_tokens: int) -> httpx.Response:
    return httpx.post(router.url + "/v1/completions", timeout=60, json={
        "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True})


def served(wp) -> float:
    return worker_metric(wp, "pdorch_decode_requests_total", outcome="finished")


def test_a_request_only_the_larger_pool_holds_is_served_by_it_every_time(stack):
    cluster, router, large = stack
    small = cluster.decode
    before = served(small), served(large)
    for _ in range(4):  # least load alone would send some to the small worker
        out = completion(router, 200)  # 240 tokens: more than the small pool's 128, within the large's 384
        assert out.status_code == 200, out.text
        assert out.json()["usage"]["completion_tokens"] == 200
    assert served(small) == before[0] and served(large) == before[1] + 4


def test_one_that_fits_both_may_go_to_either(stack):
    cluster, router, large = stack
    before = served(cluster.decode) + served(large)
    for _ in range(4):
        assert completion(router, 20).status_code == 200
    assert served(cluster.decode) + served(large) == before + 4
    assert served(cluster.decode) > 0  # the small worker is used for what it holds


def test_one_that_fits_neither_is_refused_naming_the_largest_pool(stack):
    _, router, _ = stack
    out = completion(router, LARGE * 16)
    assert out.status_code == 400
    err = out.json()["error"]
    assert err["param"] == "max_tokens" and f"{LARGE * 16} tokens" in err["message"], err
    assert "decode.num_pages" in err["message"]
