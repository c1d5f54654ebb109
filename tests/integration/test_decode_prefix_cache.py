"""The decode worker's own prefix cache (decode_node/prefix_cache.py) with SmolLM2, a real
mooncake_master and real prefill/decode processes: the KV a decode worker computed or generated is
reused on the next turn although the store dropped it (every key removed) and the prefill worker's
L1 was flushed:

1. A short next turn is served by the decode worker alone from its own cache: no store read, no
   Prefill call, `device` cached tokens.
2. A long next turn goes through the prefill worker, which reads the pages the decode worker holds
   from its pool (PrefillRequest.decode_cached_pages): nothing of the prefix is computed again or
   read from the store, and P pushes only the pages D lacked.

Greedy output equals the single-process engine's each time."""

from __future__ import annotations

import pytest

from pdorch.local_stack.workers import start_cluster, worker_metric
from pdorch.worker.prompt_pages import reusable_pages
from store_client.evictor import master_fill
from tests.integration.test_disagg_smollm2 import reference, tok  # noqa: F401 - fixtures
from tests.integration.test_store_to_decode import PAGE_NBYTES

PAGE_SIZE = 16
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, smollm2_dir):
    c = start_cluster(tmp_path_factory.mktemp("decode_prefix_cache"), smollm2_dir, with_store=True,
                      prefill={"num_pages": 256},
                      decode={"num_pages": 256, "prefix_cache": True, "offload_generated_kv": True,
                              "max_local_prefill_tokens": 256, "prefill_timeout_s": 240.0})
    yield c
    c.stop()


def drop_every_store_key(cluster) -> None:
    """The store loses everything (as if its eviction had removed it) and P's L1 is flushed."""
    from mooncake.store import MooncakeDistributedStore

    from proto.pdorch.v1 import worker_pb2 as pb

    cluster.wait_idle("decode")
    cluster.wait_idle("prefill")
    client = MooncakeDistributedStore()
    m = cluster.master
    assert client.setup("127.0.0.1", m.metadata_url, 0, 16 << 20, "tcp", "", m.master_address) == 0
    try:
        assert client.remove_all(True) >= 0  # force: read leases do not keep anything
    finally:
        client.close()
    assert master_fill(m.metrics_text()).key_count == 0
    cluster.prefill_stub().Flush(pb.FlushRequest(), timeout=30)


def counters(cluster) -> dict[str, float]:
    p, d = cluster.prefill, cluster.decode
    return {
        "p_requests": worker_metric(p, "pdorch_prefill_requests_total"),
        "p_store_loaded": worker_metric(p, "pdorch_prefill_store_pages_loaded_total"),
        "p_from_decode": worker_metric(p, "pdorch_prefill_decode_pool_pages_total", outcome="read"),
        "p_computed": worker_metric(p, "pdorch_prefill_prompt_tokens_total", source="computed"),
        "pushed": worker_metric(p, "pdorch_prefill_push_pages_total", kind="pushed"),
        "transfer_bytes": worker_metric(p, "pdorch_prefill_transfer_bytes_total"),
        "d_read": worker_metric(d, "pdorch_decode_prefix_store_pages_total", outcome="loaded"),
        "d_hits": worker_metric(d, "pdorch_decode_l1_hit_pages_total"),
        "local": worker_metric(d, "pdorch_decode_prompt_plans_total", where="local", reason="short_tail"),
        "long_tail": worker_metric(d, "pdorch_decode_prompt_plans_total", where="prefill", reason="long_tail"),
        "local_tokens": worker_metric(d, "pdorch_decode_local_prefill_tokens_total"),
    }


def delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in before}


def held_pages(context: list[int], prompt: list[int]) -> int:
    """Reusable pages of `prompt` the decode worker holds after serving `context` (its prompt + answer):
    every full page it fed (the last answer token is never fed), where the prompt continues it."""
    fed = len(context) - 1
    same = next((i for i, (a, b) in enumerate(zip(context, prompt)) if a != b), min(len(context), len(prompt)))
    return min(min(fed, same) // PAGE_SIZE, reusable_pages(len(prompt), PAGE_SIZE))


def test_pages_computed_on_the_decode_worker_are_reused_after_the_store_dropped_them(cluster, tok, reference):  # noqa: F811
    history = [{"role": "user", "content": "Tell me a short story about a lighthouse keeper."}]
    turn1 = tok.encode_chat(history)
    out1 = cluster.generate(turn1, max_tokens=40).token_ids  # through P (nothing cached yet), 40 generated on D
    answer1 = tok.decode([t for t in out1 if t not in tok.eos_token_ids], skip_special_tokens=True)
    history += [{"role": "assistant", "content": answer1}, {"role": "user", "content": "Give the story a title."}]
    turn2 = tok.encode_chat(history)
    assert turn2[:len(turn1) + len(out1)] == turn1 + out1  # the tokenization condition (decode_node/offload.py)
    held = held_pages(turn1 + out1, turn2)
    assert held > len(turn1) // PAGE_SIZE  # pages the decode worker generated itself are among them

    # 1. The store lost every page and P's L1 is empty: only the decode worker's own cache has the prefix.
    drop_every_store_key(cluster)
    before = counters(cluster)
    got2 = cluster.generate(turn2, max_tokens=MAX_TOKENS)
    d = delta(before, counters(cluster))
    assert d["local"] == 1 and d["p_requests"] == 0  # served by D alone
    assert d["d_hits"] == held and d["d_read"] == 0
    assert (got2.cached.device, got2.cached.store) == (held * PAGE_SIZE, 0)
    assert d["local_tokens"] == len(turn2) - held * PAGE_SIZE  # D computed the new turn itself
    assert got2.token_ids == reference([turn2])[0]

    # 2. A long next turn: P computes it, reading the prefix from D's pool. The store lost everything
    # again (turn 2's pages D computed and generated included), P's L1 is empty again.
    answer2 = tok.decode([t for t in got2.token_ids if t not in tok.eos_token_ids], skip_special_tokens=True)
    rules = " ".join(f"Rule {i}: the keeper lights lamp {i} at {i % 12 + 1} o'clock." for i in range(40))
    history += [{"role": "assistant", "content": answer2}, {"role": "user", "content": rules + " Which lamp is last?"}]
    turn3 = tok.encode_chat(history)
    assert turn3[:len(turn2) + len(got2.token_ids)] == turn2 + got2.token_ids
    held3 = held_pages(turn2 + got2.token_ids, turn3)
    assert held3 * PAGE_SIZE > len(turn2) - PAGE_SIZE and len(turn3) - held3 * PAGE_SIZE > 256  # D's own pages; a long tail
    drop_every_store_key(cluster)
    before = counters(cluster)
    got3 = cluster.generate(turn3, max_tokens=MAX_TOKENS)
    d = delta(before, counters(cluster))
    num_pages = -(-len(turn3) // PAGE_SIZE)
    assert d["long_tail"] == 1 and d["p_requests"] == 1 and d["d_hits"] == held3
    assert d["p_from_decode"] == held3 and d["p_store_loaded"] == 0 and d["d_read"] == 0
    assert d["p_computed"] == len(turn3) - held3 * PAGE_SIZE  # only the new tail was computed
    assert (got3.cached.device, got3.cached.store) == (held3 * PAGE_SIZE, 0)
    assert d["pushed"] == num_pages - held3 and d["transfer_bytes"] == (num_pages - held3) * PAGE_NBYTES
    assert got3.token_ids == reference([turn3])[0]
    cluster.assert_pools_sound()


def test_a_flushed_decode_cache_sends_the_next_turn_to_the_store(cluster, tok):  # noqa: F811
    from proto.pdorch.v1 import worker_pb2 as pb

    prompt = tok.encode_chat([{"role": "user", "content": "Name three rivers of Europe and one fact about each."}])
    cluster.generate(prompt, max_tokens=20)
    cluster.wait_idle("decode")
    cluster.wait_idle("prefill")
    freed = cluster.decode_stub().Flush(pb.FlushRequest(), timeout=30).pages_freed
    assert freed >= len(prompt) // PAGE_SIZE  # the prompt's full pages (and the generated ones) were held
    before = counters(cluster)
    again = cluster.generate(prompt, max_tokens=4)
    d = delta(before, counters(cluster))
    n_reuse = reusable_pages(len(prompt), PAGE_SIZE)
    assert d["d_hits"] == 0 and d["local"] == 1 and d["d_read"] == n_reuse  # from the store now
    assert (again.cached.device, again.cached.store) == (0, n_reuse * PAGE_SIZE)
    cluster.assert_pools_sound()
