"""Each family through the whole P/D path: router -> decode -> prefill with the real master, transfer
engine and store, on random checkpoints built by transformers. Greedy output equals transformers'
`generate` on both turns of a conversation; the second turn (P's L1 flushed) reads its prefix from
the store. Qwen2 runs at page size 64, as the seed deployment does."""

from __future__ import annotations

import dataclasses

import httpx
import pytest
import torch

from engine.tokenizer import Tokenizer
from pdorch.local_stack.hf_checkpoints import build_checkpoint
from pdorch.local_stack.router import RouterThread, router_config
from pdorch.local_stack.workers import start_cluster

PAGE_SIZE = {"llama3": 16, "qwen2": 64, "qwen3": 16}
MAX_TOKENS = 12
QUESTION = " ".join(f"Item {i} of the list is a {['red', 'green', 'blue'][i % 3]} box of {i * 7 % 13} cups."
                    for i in range(12)) + " Which boxes are blue?"


@dataclasses.dataclass
class FamilyCluster:
    family: str
    model_dir: object
    cluster: object
    router: RouterThread
    tok: Tokenizer
    hf: object


@pytest.fixture(scope="module", params=list(PAGE_SIZE))
def fc(request, tmp_path_factory):
    family = request.param
    tmp = tmp_path_factory.mktemp(f"family_{family}")
    model_dir = build_checkpoint(family, tmp / "checkpoint", seed=11)
    cluster = start_cluster(tmp, model_dir, with_store=True, model={"page_size": PAGE_SIZE[family]},
                            decode={"offload_generated_kv": True})
    router = None
    try:
        base = router_config([cluster.prefill.address], [cluster.decode.address], policy="cache_aware")
        cfg = dataclasses.replace(cluster.cfg, router=base.router, discovery=base.discovery)
        router = RouterThread(cfg, Tokenizer.from_dir(model_dir), model_dir).start()
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
        yield FamilyCluster(family, model_dir, cluster, router, Tokenizer.from_dir(model_dir), hf)
    finally:
        if router is not None:
            router.stop()
        cluster.stop()


def transformers_greedy(hf, ids: list[int]) -> list[int]:
    from transformers import GenerationConfig

    gc = GenerationConfig(max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        return hf.generate(torch.tensor([ids]), generation_config=gc)[0, len(ids):].tolist()


def generate(fc: FamilyCluster, ids: list[int]) -> dict:
    body = {"input_ids": ids, "sampling_params": {"temperature": 0.0, "max_new_tokens": MAX_TOKENS,
                                                  "ignore_eos": True}}
    resp = httpx.post(fc.router.url + "/generate", json=body, timeout=180)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_two_turns_equal_transformers_and_the_second_reads_the_store(fc):
    page = PAGE_SIZE[fc.family]
    turn1 = fc.tok.encode_chat([{"role": "user", "content": QUESTION}])
    assert len(turn1) > 2 * page  # full pages to reuse at every page size
    out1 = generate(fc, turn1)
    assert out1["output_ids"] == transformers_greedy(fc.hf, turn1)
    assert out1["meta_info"]["cached_tokens"] == 0

    # Turn 2 continues turn 1's ids (the hash chain of decode's offloaded pages stays continuous).
    turn2 = turn1 + out1["output_ids"] + fc.tok.encode("\nAnd the green ones?", add_special_tokens=False)
    c = fc.cluster
    c.flush_l1()  # every L1, D's own too: the prefix can only come from the store now
    loaded_before = c.stats("prefill").store_pages_loaded + c.stats("decode").store_pages_loaded
    out2 = generate(fc, turn2)
    assert out2["output_ids"] == transformers_greedy(fc.hf, turn2)
    meta = out2["meta_info"]
    assert meta["cached_tokens_details"]["store"] >= (len(turn1) // page) * page > 0
    assert meta["cached_tokens"] == meta["cached_tokens_details"]["store"]
    loaded = c.stats("prefill").store_pages_loaded + c.stats("decode").store_pages_loaded - loaded_before
    assert loaded >= len(turn1) // page
    c.assert_pools_sound()


def test_workers_report_family_and_dtypes(fc):
    info = fc.cluster.stats("prefill").info
    assert (info.model_family, info.page_size, info.kv_dtype, info.dtype) == (
        {"llama3": "llama"}.get(fc.family, fc.family), PAGE_SIZE[fc.family], "float32", "float32")
