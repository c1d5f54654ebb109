"""Tensor-parallel workers through the whole P/D path (router -> D -> P, with the real master, transfer
engine and store; ranks are real processes over gloo), on random checkpoints built by transformers: a
Qwen2 with 2 KV heads (D at TP 4 replicates them) and a Llama-3 with 8.

One cluster per model holds prefill workers at TP 1 and 2 and decode workers at TP 1, 2 and 4; a router
per (P, D) pair routes to that pair only. Each pair serves a conversation whose greedy output must equal
transformers' `generate`, and whose second turn (every L1 flushed) reads its prefix from the store,
written by workers of other TP sizes than the ones that read it.
"""

from __future__ import annotations

import dataclasses
import time

import httpx
import pytest
import torch

from engine.tokenizer import Tokenizer
from pdorch.local_stack.hf_checkpoints import build_checkpoint
from pdorch.local_stack.router import RouterThread, router_config
from pdorch.local_stack.workers import start_cluster
from pdorch.worker.prompt_pages import reusable_pages
from proto.pdorch.v1 import worker_pb2 as pb

PAGE = 16
MAX_TOKENS = 8
PAIRS = [(1, 1), (2, 1), (1, 2), (2, 2), (2, 4)]
MODELS = {
    "qwen2-kv2": ("qwen2", {}),
    "llama3-kv8": ("llama3", {"shape": {"num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 8}}),
}


@dataclasses.dataclass
class TPCluster:
    cluster: object
    prefill: dict   # tp_size -> WorkerProc
    decode: dict
    tok: Tokenizer
    hf: object
    model_dir: object
    routers: dict = dataclasses.field(default_factory=dict)  # (P tp, D tp) -> RouterThread over that pair

    def router(self, p: int, d: int) -> RouterThread:
        if (p, d) not in self.routers:
            base = router_config([self.prefill[p].address], [self.decode[d].address])
            cfg = dataclasses.replace(self.cluster.cfg, router=base.router, discovery=base.discovery)
            self.routers[p, d] = RouterThread(cfg, self.tok, self.model_dir).start()
        return self.routers[p, d]


@pytest.fixture(scope="module", params=list(MODELS))
def tpc(request, tmp_path_factory):
    family, kw = MODELS[request.param]
    tmp = tmp_path_factory.mktemp(f"tp_{request.param}")
    # NOTE: std 0.3: tiny random weights at the default 0.05 answer one token over and over, which would
    # hide a wrong head map; these give varied greedy tokens
    model_dir = build_checkpoint(family, tmp / "checkpoint", seed=5, std=0.3, **kw)
    # every prompt goes to P (no local prefill on D): the P -> D transfer between TP sizes is what is tested;
    # D still reads the prefix the store holds itself (its own loads across its ranks)
    cluster = start_cluster(tmp, model_dir, with_store=True, model={"page_size": PAGE},
                            decode={"offload_generated_kv": True, "max_local_prefill_tokens": 0})
    tpc = None
    try:
        with cluster.stopped_on_failure():
            prefill = {1: cluster.prefill, 2: cluster.spawn_worker("prefill", tp_size=2)}
            decode = {1: cluster.decode, 2: cluster.spawn_worker("decode", tp_size=2),
                      4: cluster.spawn_worker("decode", tp_size=4)}
            cluster.wait_ready(prefill[2], decode[2], decode[4])
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
        tpc = TPCluster(cluster, prefill, decode, Tokenizer.from_dir(model_dir), hf, model_dir)
        yield tpc
    finally:
        try:
            for r in tpc.routers.values() if tpc is not None else ():
                r.stop()
        finally:  # NOTE: a router that does not stop fails the test, and must not leave the workers running
            cluster.stop()


def transformers_greedy(hf, ids: list[int]) -> list[int]:
    from transformers import GenerationConfig

    gc = GenerationConfig(max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        return hf.generate(torch.tensor([ids]), generation_config=gc)[0, len(ids):].tolist()


def prompt(tok: Tokenizer, i: int) -> list[int]:
    text = " ".join(f"Crate {j} holds {(j * 7 + i) % 11} {['pears', 'nails', 'maps'][j % 3]}." for j in range(9))
    return tok.encode_chat([{"role": "user", "content": f"Conversation {i}. {text} Which crates hold maps?"}])


@dataclasses.dataclass
class Served:
    token_ids: list[int]
    cached: dict  # meta_info.cached_tokens_details: device, host, store, ssd


def serve(t: TPCluster, ids: list[int], p: int, d: int) -> Served:
    """One greedy /generate through the router of the (P, D) pair."""
    body = {"input_ids": ids, "sampling_params": {"temperature": 0.0, "max_new_tokens": MAX_TOKENS,
                                                  "ignore_eos": True}}
    resp = httpx.post(t.router(p, d).url + "/generate", json=body, timeout=180)
    assert resp.status_code == 200, resp.text
    meta = resp.json()["meta_info"]
    return Served(resp.json()["output_ids"], meta["cached_tokens_details"])


@pytest.mark.parametrize("p, d", PAIRS)
def test_greedy_output_equals_transformers_and_turn_two_reads_the_store(tpc, p, d):
    turn1 = prompt(tpc.tok, PAIRS.index((p, d)))
    pushed = tpc.cluster.stats("prefill", tpc.prefill[p]).transfer_bytes
    first = serve(tpc, turn1, p, d)
    assert first.token_ids == transformers_greedy(tpc.hf, turn1)
    assert tpc.cluster.stats("prefill", tpc.prefill[p]).transfer_bytes > pushed  # P computed and pushed it
    assert len(set(first.token_ids)) > 1  # varied output: a wrong head would show
    # the next turn on the other pair of sizes, every L1 flushed: its prefix comes from the store only,
    # written by this turn's workers (and read by workers of other TP sizes)
    turn2 = turn1 + first.token_ids + tpc.tok.encode(" And the pears?", add_special_tokens=False)
    tpc.cluster.flush_l1()
    p2, d2 = 3 - p, d if p == 2 else 2
    second = serve(tpc, turn2, p2, d2)
    assert second.token_ids == transformers_greedy(tpc.hf, turn2)
    # cached = the page-aligned prefix the two turns share (turn 1 and its output, D's offloaded pages)
    shared = min((len(turn1) + len(first.token_ids)) // PAGE, reusable_pages(len(turn2), PAGE)) * PAGE
    assert second.cached["store"] + second.cached["device"] == shared >= len(turn1) // PAGE * PAGE, second.cached
    assert second.cached["store"] > 0
    # turn 3 on the same pair with only P's L1 flushed: D's own cache holds the prefix, so P reads the
    # pages it attends to from D's pool (every D rank's heads, into every P rank's) instead of the store
    turn3 = turn2 + second.token_ids + tpc.tok.encode(" And the nails?", add_special_tokens=False)
    tpc.cluster.wait_idle("prefill", wp=tpc.prefill[p2])
    tpc.cluster.prefill_stub(tpc.prefill[p2]).Flush(pb.FlushRequest(), timeout=30)
    third = serve(tpc, turn3, p2, d2)
    assert third.token_ids == transformers_greedy(tpc.hf, turn3)
    assert third.cached["device"] >= (len(turn2) // PAGE) * PAGE, third.cached


def test_workers_report_their_tp_size(tpc):
    for role, workers in (("prefill", tpc.prefill), ("decode", tpc.decode)):
        for size, wp in workers.items():
            assert tpc.cluster.stats(role, wp).info.tp_size == size
    # the router learns it too (pdorch status shows it): its /workers over the (2, 4) pair
    url = tpc.router(2, 4).url + "/workers"
    deadline = time.monotonic() + 10
    while None in (infos := [w["info"] for w in httpx.get(url, timeout=30).json()["workers"]]):
        assert time.monotonic() < deadline, infos
        time.sleep(0.2)
    assert sorted(i["tp_size"] for i in infos) == [2, 4]
