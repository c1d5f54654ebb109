"""Preemption on a real decode worker (decode_node/preemption.py): streams that together outgrow its
KV pool all complete, each equal to the same request served alone, greedy and seeded; the pages a
preempted request gets back come from the worker's own pool and the store, none recomputed.

Cluster: real mooncake_master, one prefill and one decode worker process (tiny random-weights model,
transfer engine over TCP), the decode pool far smaller than the streams' KV, its growth reserve off
so that admission lets the pool run dry. The failover of a preempted stream, with SmolLM2 and a
router: tests/integration/test_failover_midstream.py.
"""

from __future__ import annotations

import concurrent.futures

import pytest

from pdorch.local_stack.workers import start_cluster, worker_metric

PAGE_SIZE = 16
NUM_PAGES = 16
MAX_TOKENS = 120  # 40-token prompts end at 160 tokens: 10 pages each, 40 for the four, 2.5x the pool
PROMPTS = [[(seed * 7919 + i * 31) % 1000 + 10 for i in range(40)] for seed in range(4)]
SAMPLINGS = {"greedy": {"temperature": 0.0}, "seeded": {"temperature": 0.9, "top_k": 50, "seed": 77}}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, tiny_model_dir):
    c = start_cluster(tmp_path_factory.mktemp("preemption"), tiny_model_dir, with_store=True,
                      decode={"num_pages": NUM_PAGES, "growth_reserve": 0.0, "prefix_cache": True,
                              "offload_generated_kv": True})
    yield c
    c.stop()


def resumed(cluster) -> dict[str, float]:
    return {source: worker_metric(cluster.decode, "pdorch_decode_resumed_tokens_total", source=source)
            for source in ("cache", "store", "recomputed")}


@pytest.mark.parametrize("sampling", ["greedy", "seeded"])
def test_streams_that_outgrow_the_decode_pool_complete_equal_to_each_served_alone(cluster, sampling):
    kwargs = SAMPLINGS[sampling]
    alone = [cluster.generate(p, max_tokens=MAX_TOKENS, ignore_eos=True, **kwargs).token_ids for p in PROMPTS]
    assert all(len(a) == MAX_TOKENS for a in alone)
    cluster.wait_idle("decode")
    preempted, before = worker_metric(cluster.decode, "pdorch_decode_preemptions_total"), resumed(cluster)
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda p: cluster.generate(p, max_tokens=MAX_TOKENS, ignore_eos=True, **kwargs),
                                 PROMPTS))
    assert [r.token_ids for r in together] == alone  # no token lost, repeated or different
    assert all(r.finish_reason == "length" for r in together)
    assert worker_metric(cluster.decode, "pdorch_decode_preemptions_total") > preempted
    after = resumed(cluster)
    assert after["cache"] > before["cache"] and after["store"] > before["store"], (before, after)
    assert after["recomputed"] == before["recomputed"], (before, after)  # the store held every page
    st = cluster.wait_idle("decode")
    assert st.info.preemptions > 0 and st.info.preempted_requests == 0
    cluster.assert_pools_sound()


def test_a_request_the_pool_could_never_hold_is_refused_before_admission(cluster):
    import grpc

    with pytest.raises(grpc.RpcError) as err:
        cluster.generate(PROMPTS[0], max_tokens=NUM_PAGES * PAGE_SIZE, ignore_eos=True)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "decode.num_pages" in err.value.details() and f"pool has {NUM_PAGES}" in err.value.details()
    cluster.assert_pools_sound()
