"""Real router + 2 prefill + 1 decode worker processes + mooncake_master (tiny model, TCP loopback):
the official openai client, /generate's schema, cache-aware routing and prefill failover."""

from __future__ import annotations

import dataclasses
import json
import time

import httpx
import openai
import pytest

from engine.tokenizer import Tokenizer
from pdorch.local_stack.processes import stop_process
from pdorch.local_stack.router import RouterThread, router_config
from pdorch.local_stack.workers import start_cluster

PAGE_SIZE = 16


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, tiny_model_dir):
    c = start_cluster(tmp_path_factory.mktemp("router_cluster"), tiny_model_dir, with_store=True, num_prefill=2)
    yield c
    c.stop()


@pytest.fixture(scope="module")
def router(cluster, tiny_model_dir):
    prefills = [w.address for w in cluster.workers if w.role == "prefill"]
    base = router_config(prefills, [cluster.decode.address], policy="cache_aware")
    cfg = dataclasses.replace(cluster.cfg, router=base.router, discovery=base.discovery)
    r = RouterThread(cfg, Tokenizer.from_dir(tiny_model_dir), tiny_model_dir).start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def client(router):
    return openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model_name(cluster):
    return cluster.cfg.model.served_name


def prompt(n: int, seed: int) -> list[int]:
    return [(seed * 7919 + i * 31) % 1000 + 10 for i in range(n)]


def test_openai_chat_matches_the_workers_own_output(cluster, client, model_name, tiny_model_dir):
    messages = [{"role": "user", "content": "Tell me about the sea."}]
    ids = Tokenizer.from_dir(tiny_model_dir).encode_chat(messages)
    direct = cluster.generate(ids, max_tokens=6, ignore_eos=True)
    out = client.chat.completions.create(model=model_name, messages=messages, max_tokens=6, temperature=0,
                                         extra_body={"ignore_eos": True})
    assert out.choices[0].message.content == direct.text
    assert out.usage.prompt_tokens == len(ids) and out.usage.completion_tokens == 6
    stream = client.chat.completions.create(model=model_name, messages=messages, max_tokens=6, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == direct.text
    assert chunks[-1].usage.completion_tokens == 6
    # Same prompt again: cache_aware picks the P that computed it, which reuses every full page.
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == (len(ids) - 1) // PAGE_SIZE * PAGE_SIZE


def test_openai_completions_stream_and_non_stream_agree(client, model_name):
    ids = prompt(50, seed=3)
    out = client.completions.create(model=model_name, prompt=ids, max_tokens=5, temperature=0,
                                    extra_body={"ignore_eos": True})
    stream = client.completions.create(model=model_name, prompt=ids, max_tokens=5, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in stream) == out.choices[0].text
    assert out.usage.completion_tokens == 5 and out.choices[0].finish_reason == "length"


def test_generate_stream_schema_and_cached_tokens_on_the_second_turn(router):
    ids = prompt(70, seed=5)
    body = {"input_ids": ids, "sampling_params": {"temperature": 0.0, "max_new_tokens": 4, "ignore_eos": True},
            "stream": True}

    def run():
        with httpx.stream("POST", router.url + "/generate", json=body, timeout=120) as resp:
            assert resp.status_code == 200
            return [json.loads(ln[6:]) for ln in resp.iter_lines() if ln.startswith("data: {")]

    first, second = run(), run()
    for chunks in (first, second):
        assert len(chunks) >= 1 and chunks[-1]["meta_info"]["completion_tokens"] == 4
        for c in chunks:
            m = c["meta_info"]
            assert {"prompt_tokens", "completion_tokens", "cached_tokens", "cached_tokens_details"} <= m.keys()
            assert m["prompt_tokens"] == 70
            d = m["cached_tokens_details"]
            assert d["device"] + d["host"] + d["store"] == m["cached_tokens"] <= 70
        ids_seen = [c["output_ids"] for c in chunks]
        assert all(ids_seen[i] == ids_seen[-1][:len(ids_seen[i])] for i in range(len(ids_seen)))  # cumulative
    assert first[0]["meta_info"]["cached_tokens"] == 0
    assert second[0]["meta_info"]["cached_tokens"] == (70 - 1) // PAGE_SIZE * PAGE_SIZE
    assert second[-1]["output_ids"] == first[-1]["output_ids"] and second[-1]["text"] == first[-1]["text"]


def _wait_prefill_idle(router, timeout_s: float = 20.0) -> None:
    """Until the router weighs every prefill worker at load 0 (what it routed has been published back)."""
    def idle(w):
        ev = w.get("kv_events") or {}
        return w["in_flight"] == 0 and ev.get("published_load") == 0 and ev.get("routed_since_batch") == 0

    deadline = time.monotonic() + timeout_s
    while not all(idle(w) for w in httpx.get(router.url + "/workers", timeout=30).json()["workers"]
                  if w["role"] == "prefill"):
        assert time.monotonic() < deadline, f"prefill workers' load back to 0 within {timeout_s} s"
        time.sleep(0.02)


def _routed(router) -> dict[str, int]:
    ws = httpx.get(router.url + "/workers", timeout=30).json()["workers"]
    return {w["address"]: w["routed"] for w in ws if w["role"] == "prefill"}


def test_cache_aware_sends_a_repeated_prefix_to_the_same_prefill_worker(router):
    prefix = prompt(64, seed=11)
    before = _routed(router)
    cached = []
    for turn in range(3):
        # NOTE: a request that ended counts in its worker's load until the worker's next KV event batch;
        # a busier holder of a prefix the store also holds loses to an idle worker at once (store_covered).
        _wait_prefill_idle(router)
        out = httpx.post(router.url + "/generate", timeout=120, json={
            "input_ids": prefix + prompt(8, seed=100 + turn),
            "sampling_params": {"temperature": 0.0, "max_new_tokens": 2}}).json()
        cached.append(out["meta_info"]["cached_tokens"])
    after = _routed(router)
    deltas = sorted(after[a] - before.get(a, 0) for a in after)
    assert deltas == [0, 3]  # all three turns went to one prefill worker
    assert cached[1] >= 64 and cached[2] >= 64  # and found the prefix there


def test_killing_a_prefill_worker_routes_new_requests_to_the_other(cluster, router):
    victim, survivor = [w for w in cluster.workers if w.role == "prefill"]
    stop_process(victim.proc)
    before = _routed(router)[survivor.address]
    for i in range(4):
        out = httpx.post(router.url + "/generate", timeout=120, json={
            "input_ids": prompt(30, seed=200 + i), "sampling_params": {"temperature": 0.0, "max_new_tokens": 2}})
        assert out.status_code == 200, out.text
        assert out.json()["meta_info"]["completion_tokens"] == 2
    assert _routed(router)[survivor.address] - before == 4
    workers = {w["address"]: w for w in httpx.get(router.url + "/workers").json()["workers"]}
    assert workers[victim.address]["healthy"] is False
