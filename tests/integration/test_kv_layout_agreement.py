"""Page size and KV dtype are what every worker must agree on: workers that register (etcd) with another
page size or KV dtype are refused by name and never paired; a bfloat16 cluster on CPU serves end to end."""

from __future__ import annotations

import dataclasses

import httpx
import torch

from engine.llm import LLM
from engine.sampling_params import SamplingParams
from engine.tokenizer import Tokenizer
from pdorch.local_stack.router import RouterThread, router_config, wait_until
from pdorch.local_stack.workers import start_cluster


def test_workers_with_another_page_size_or_kv_dtype_are_refused_at_registration(tmp_path, tiny_model_dir,
                                                                               etcd_server):
    discovery = {"mode": "etcd", "etcd_endpoints": (etcd_server.endpoint,), "cluster": "layout", "lease_ttl_s": 3}
    cluster = start_cluster(tmp_path, tiny_model_dir, with_store=True, discovery=discovery)
    router = None
    try:
        odd_p = cluster.spawn_worker("prefill", sections={"model": {"dtype": "bfloat16"}})   # kv_dtype auto: bf16
        odd_d = cluster.spawn_worker("decode", sections={"model": {"page_size": 32}})
        cluster.wait_ready(odd_p, odd_d)
        base = router_config([], [], policy="round_robin")
        cfg = dataclasses.replace(cluster.cfg, router=base.router)
        router = RouterThread(cfg, Tokenizer.from_dir(tiny_model_dir), tiny_model_dir).start()

        def workers() -> dict[str, dict]:
            return {w["address"]: w for w in httpx.get(router.url + "/workers", timeout=30).json()["workers"]}
        wait_until(lambda: len(workers()) == 4 and all(w["healthy"] or w["last_error"] for w in workers().values()),
                   30, "4 registered workers checked")
        ws = workers()
        assert ws[odd_p.address]["last_error"].startswith("refused: kv_dtype bfloat16 differs from the cluster's "
                                                          "float32 (model.kv_dtype")
        assert ws[odd_d.address]["last_error"].startswith("refused: page_size 32 differs from the cluster's 16 "
                                                          "(model.page_size)")
        assert not ws[odd_p.address]["healthy"] and not ws[odd_d.address]["healthy"]
        assert ws[cluster.prefill.address]["healthy"] and ws[cluster.decode.address]["healthy"]
        for i in range(6):  # round robin would reach the odd workers if they were routable
            out = httpx.post(router.url + "/generate", timeout=120, json={
                "input_ids": list(range(100 + i, 140 + i)), "sampling_params": {"temperature": 0, "max_new_tokens": 3}})
            assert out.status_code == 200, out.text
        ws = workers()
        assert ws[odd_p.address]["routed"] == ws[odd_d.address]["routed"] == 0
        assert ws[cluster.prefill.address]["routed"] == 6
    finally:
        if router is not None:
            router.stop()
        cluster.stop()


def test_a_bfloat16_cluster_serves_on_cpu_with_the_store(tmp_path, tiny_model_dir):
    cluster = start_cluster(tmp_path, tiny_model_dir, with_store=True, model={"dtype": "bfloat16"},
                            decode={"offload_generated_kv": True})
    try:
        assert cluster.stats("prefill").info.kv_dtype == cluster.stats("decode").info.kv_dtype == "bfloat16"
        ids = Tokenizer.from_dir(tiny_model_dir).encode_chat([{"role": "user", "content": "Tell me " * 40}])
        first = cluster.generate(ids, max_tokens=8, ignore_eos=True)
        # The single-process engine in bf16 runs the same chunks (one prompt chunk, then 1-token steps).
        llm = LLM(tiny_model_dir, num_pages=64, page_size=16, dtype=torch.bfloat16, torch_threads=1)
        assert first.token_ids == llm.generate([ids], SamplingParams(temperature=0, max_tokens=8,
                                                                     ignore_eos=True))[0]
        cluster.flush_l1()  # every L1, D's own too: the prefix can only come from the store now
        second = cluster.generate(ids + first.token_ids + ids[:20], max_tokens=4)
        assert second.cached.store >= (len(ids) // 16) * 16 > 0
        cluster.assert_pools_sound()
    finally:
        cluster.stop()
