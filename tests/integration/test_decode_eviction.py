"""Decode-side writes make room through the chain evictor, with SmolLM2, a real mooncake_master and
real prefill/decode processes: conversations whose later turns the decode worker serves alone (its
local prefill's pages and the generated pages go to the store) write several times what the store
holds, and mooncake_master's own (chain-blind) eviction never runs, nor does any write find the
store full, because the decode worker's evictor removes its lowest pages before each write. The
control: the same traffic with `store.eviction: master` makes the master evict.

    store: two 16 MiB segments (the prefill and the decode worker's) = 45 SmolLM2 pages;
    5 conversations x 4 turns (a turn's five at once), each later turn ~30 new tokens + a 32-token answer
"""

from __future__ import annotations

import concurrent.futures

import pytest

from pdorch.local_stack.workers import start_cluster, worker_metric
from store_client.evictor import master_eviction_counters, master_fill

PAGE_SIZE = 16
TURNS, ANSWER = 4, 32
TOPICS = ("a lighthouse keeper", "a river barge", "a mountain village", "an old clock maker", "a desert well")


def run_traffic(tmp, smollm2_dir, tok, eviction: str) -> dict:
    tmp.mkdir(parents=True, exist_ok=True)
    c = start_cluster(tmp, smollm2_dir, with_store=True, prefill={"num_pages": 128},
                      store={"global_segment_size_mb": 16, "eviction": eviction},
                      decode={"num_pages": 256, "prefix_cache": True, "offload_generated_kv": True,
                              "max_local_prefill_tokens": 256, "prefill_timeout_s": 240.0})
    try:
        histories = [[{"role": "user", "content": f"Tell me about {t} in two sentences."}] for t in TOPICS]
        # NOTE: a turn's conversations at once (the decode worker batches them): the same pages written
        # and evicted as one after another, in half the time
        with concurrent.futures.ThreadPoolExecutor(len(TOPICS)) as pool:
            for turn in range(TURNS):
                for h in histories:
                    if turn:
                        h.append({"role": "user", "content": f"Now add detail number {turn} about the weather, "
                                  "the people and the food there, in one long sentence."})
                answers = list(pool.map(lambda h: c.generate(tok.encode_chat(h), max_tokens=ANSWER, ignore_eos=True),
                                        histories))
                for h, got in zip(histories, answers):
                    h.append({"role": "assistant", "content": got.text})
        c.wait_idle("decode")
        c.wait_idle("prefill")
        local = worker_metric(c.decode, "pdorch_decode_prompt_plans_total", where="local")
        text = c.master.metrics_text()
        return {"master": master_eviction_counters(text), "fill": master_fill(text),
                "local": local, "d_written": worker_metric(c.decode, "pdorch_decode_store_pages_written_total"),
                "d_evicted": worker_metric(c.decode, "pdorch_store_evicted_pages_total"),
                "p_evicted": worker_metric(c.prefill, "pdorch_store_evicted_pages_total"),
                "d_leased": worker_metric(c.decode, "pdorch_store_evict_skipped_pages_total", reason="leased"),
                "d_skipped": worker_metric(c.decode, "pdorch_decode_store_writes_skipped_pages_total"),
                "p_written": worker_metric(c.prefill, "pdorch_prefill_store_pages_written_total")}
    finally:
        c.stop()


@pytest.fixture(scope="module")
def tok(smollm2_dir):
    from engine.tokenizer import Tokenizer
    return Tokenizer.from_dir(smollm2_dir)


def test_decode_writes_make_room_so_the_masters_eviction_never_runs(tmp_path, smollm2_dir, tok):
    chain = run_traffic(tmp_path / "chain", smollm2_dir, tok, "chain")
    capacity_pages = chain["fill"].capacity_bytes // (30 * 2 * 3 * PAGE_SIZE * 64 * 4)
    assert chain["local"] >= len(TOPICS) * (TURNS - 1) - 1  # the later turns: the decode worker alone
    # It had more pages to place than the store holds (some it did not write: they would have been
    # the next victims, its prefix cache keeps them), wrote about a store's worth, and made room itself.
    assert chain["d_written"] + chain["d_skipped"] > 1.5 * capacity_pages, chain
    assert chain["d_written"] > 0.8 * capacity_pages and chain["d_evicted"] > 0, chain
    assert chain["master"]["evicted_keys"] == 0 and chain["master"]["put_no_space"] == 0, chain
    assert chain["fill"].ratio <= 0.9
    # The control: with only the master's eviction the same traffic makes it evict.
    control = run_traffic(tmp_path / "master", smollm2_dir, tok, "master")
    assert control["d_written"] > capacity_pages and control["d_evicted"] == 0, control
    assert control["master"]["evicted_keys"] > 0
