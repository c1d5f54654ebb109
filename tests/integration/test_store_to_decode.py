"""The decode worker reading cached prefixes from the store itself (issue 16, parts 1 and 2), with
SmolLM2, a real mooncake_master and real prefill/decode processes:

1. With the prefix in the store and a long new tail, D reads the prefix pages itself while P
   computes the tail: P pushes only the pages D lacks (P's push metrics and transfer bytes).
2. A follow-up turn with a short new message is served by D alone: no Prefill call reaches P.

Greedy output equals the single-process engine's in both, as it does on the normal path
(test_disagg_smollm2)."""

from __future__ import annotations

import pytest

from pdorch.local_stack.workers import start_cluster, worker_metric
from pdorch.worker.prompt_pages import reusable_pages
from tests.integration.test_disagg_smollm2 import chat, long_document, reference, tok  # noqa: F401 - fixtures

PAGE_SIZE = 16
MAX_TOKENS = 12
PAGE_NBYTES = 30 * 2 * 3 * PAGE_SIZE * 64 * 4  # SmolLM2-135M fp32: layers x K,V x kv heads x tokens x head dim


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, smollm2_dir):
    c = start_cluster(tmp_path_factory.mktemp("store_to_decode"), smollm2_dir, with_store=True,
                      prefill={"num_pages": 512},
                      # NOTE: the decode worker's own prefix cache off: with it, D would hold these prompts
                      # itself and never read the store (tests/integration/test_decode_prefix_cache.py)
                      decode={"num_pages": 512, "offload_generated_kv": True, "load_prefix_from_store": True,
                              "max_local_prefill_tokens": 256, "prefill_timeout_s": 240.0,
                              "prefix_cache": False})
    yield c
    c.stop()


def counters(cluster) -> dict[str, float]:
    p, d = cluster.prefill, cluster.decode
    return {
        "pushed": worker_metric(p, "pdorch_prefill_push_pages_total", kind="pushed"),
        "decode_loaded": worker_metric(p, "pdorch_prefill_push_pages_total", kind="decode_loaded"),
        "transfer_bytes": worker_metric(p, "pdorch_prefill_transfer_bytes_total"),
        "p_requests": worker_metric(p, "pdorch_prefill_requests_total"),
        "d_read": worker_metric(d, "pdorch_decode_prefix_store_pages_total", outcome="loaded"),
        "d_read_failed": worker_metric(d, "pdorch_decode_prefix_store_pages_total", outcome="failed"),
        "long_tail": worker_metric(d, "pdorch_decode_prompt_plans_total", where="prefill", reason="long_tail"),
        "local": worker_metric(d, "pdorch_decode_prompt_plans_total", where="local", reason="short_tail"),
        "local_tokens": worker_metric(d, "pdorch_decode_local_prefill_tokens_total"),
    }


def delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in before}


def test_with_the_prefix_in_the_store_p_pushes_only_the_pages_d_lacks(cluster, tok, reference):  # noqa: F811
    doc = long_document()
    first = chat(tok, doc + "\n\nHow many boats does section 3 mention?")
    rules = " ".join(f"Rule {i}: a boat moored at the {['north', 'east', 'west'][i % 3]} quay pays {i * 3} coins."
                     for i in range(30))
    second = chat(tok, doc + "\n\n" + rules + "\n\nWhich rule is the most expensive?")
    shared = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b)
    in_store = shared // PAGE_SIZE  # first's full pages were written back; second's pages inside the shared part match
    assert in_store > 60 and len(second) - in_store * PAGE_SIZE > 256  # a long new tail: P is called
    cluster.generate(first, max_tokens=2)
    cluster.wait_idle("prefill")  # its write-back finished
    before = counters(cluster)
    got = cluster.generate(second, max_tokens=MAX_TOKENS)
    d = delta(before, counters(cluster))
    num_pages = -(-len(second) // PAGE_SIZE)
    assert d["long_tail"] == 1 and d["local"] == 0
    assert (d["d_read"], d["d_read_failed"]) == (in_store, 0)
    assert d["decode_loaded"] == in_store
    assert d["pushed"] == num_pages - in_store
    assert d["transfer_bytes"] == (num_pages - in_store) * PAGE_NBYTES  # only the uncached pages moved P->D
    # P still had the prefix for its own attention (its L1 here): nothing of it was computed again
    assert got.cached.device + got.cached.store == in_store * PAGE_SIZE
    assert got.token_ids == reference([second])[0]
    cluster.assert_pools_sound()


def test_a_short_follow_up_turn_is_served_without_a_prefill_call(cluster, tok, reference):  # noqa: F811
    turn1, out1, turn2 = cluster.two_turns(tok, "Tell me a short story about a lighthouse keeper.",
                                           "Give the story a title.")
    fed = len(turn1) + len(out1) - 1  # the last generated token is never fed, so never stored
    in_store = min(fed // PAGE_SIZE, reusable_pages(len(turn2), PAGE_SIZE))
    assert len(turn2) - in_store * PAGE_SIZE <= 256
    before = counters(cluster)
    got = cluster.generate(turn2, max_tokens=MAX_TOKENS)
    d = delta(before, counters(cluster))
    assert d["local"] == 1
    assert d["p_requests"] == 0 and d["pushed"] == 0  # no Prefill call reached the prefill worker
    assert d["d_read"] == in_store
    assert d["local_tokens"] == len(turn2) - in_store * PAGE_SIZE
    assert got.cached.store == in_store * PAGE_SIZE and got.cached.device == 0
    assert got.token_ids == reference([turn2])[0]
    cluster.assert_pools_sound()
