"""Disaggregated serving with SmolLM2: real mooncake_master, prefill and decode processes, real
transfer engine over TCP. Greedy output must equal the single-process engine token for token;
prefix KV must come back from the store after P's L1 is flushed; generated KV offloaded by D must
serve the next turn."""

from __future__ import annotations

import concurrent.futures

import pytest

from engine.llm import LLM
from engine.sampling_params import SamplingParams
from engine.tokenizer import Tokenizer
from pdorch.local_stack.workers import start_cluster
from pdorch.worker.prompt_pages import reusable_pages
from proto.pdorch.v1 import worker_pb2 as pb

PAGE_SIZE = 16
MAX_TOKENS = 12


def long_document(sections: int = 45) -> str:
    towns = ["Ashford", "Brookvale", "Cedar Point", "Dunmore", "Elmstead", "Fairhaven", "Glenwood"]
    goods = ["wool", "salt", "timber", "copper", "grain", "glass", "honey"]
    return " ".join(
        f"Section {i}: the river passes {towns[i % 7]}, where {i * 13 % 97} merchants trade {goods[i * 3 % 7]} "
        f"every {['Monday', 'Wednesday', 'Friday'][i % 3]} and the harbour keeps {i * 7 % 41} boats."
        for i in range(sections))


@pytest.fixture(scope="module")
def tok(smollm2_dir):
    return Tokenizer.from_dir(smollm2_dir)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, smollm2_dir):
    c = start_cluster(tmp_path_factory.mktemp("smollm2_cluster"), smollm2_dir, with_store=True,
                      prefill={"num_pages": 512},
                      # 16 concurrent prompts queue on one P sharing 2 busy cores: allow for the queueing.
                      # NOTE: no prefix cache on D: these tests read the store (test_decode_prefix_cache.py: with it)
                      decode={"num_pages": 512, "offload_generated_kv": True, "prefill_timeout_s": 240.0,
                              "prefix_cache": False})
    yield c
    c.stop()


@pytest.fixture(scope="module")
def reference(smollm2_dir):
    """Single-process engine output (greedy), computed once per prompt."""
    llm = LLM(smollm2_dir, num_pages=256, page_size=PAGE_SIZE, torch_threads=2)
    cache: dict = {}

    def ref(prompts: list[list[int]], max_tokens: int | list[int] = MAX_TOKENS) -> list[list[int]]:
        limits = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)
        keys = [(tuple(p), m) for p, m in zip(prompts, limits)]
        todo = [k for k in dict.fromkeys(keys) if k not in cache]
        if todo:  # one batched run: continuous batching in the reference engine too
            outs = llm.generate([list(p) for p, _ in todo],
                                [SamplingParams(temperature=0.0, max_tokens=m) for _, m in todo])
            cache.update(zip(todo, outs))
        return [cache[k] for k in keys]

    return ref


def chat(tok, text: str) -> list[int]:
    return tok.encode_chat([{"role": "user", "content": text}])


def test_greedy_output_equals_single_process_engine(cluster, tok, reference):
    prompts = [chat(tok, q) for q in (
        "What is the capital of France?", "Write a haiku about the sea.", "List three prime numbers.",
        "Explain what a KV cache is in one sentence.",
        long_document() + "\n\nWhich town is mentioned in section 12? Answer briefly.")]
    assert len(prompts[-1]) > 1000
    expected = reference(prompts)
    for ids, want in zip(prompts, expected):
        got = cluster.generate(ids, max_tokens=MAX_TOKENS)
        assert got.token_ids == want, f"prompt of {len(ids)} tokens diverged"
        assert got.prompt_tokens == len(ids)
        assert got.finish_reason in ("stop", "length")
    cluster.assert_pools_sound()


def test_long_prefix_comes_back_from_the_store_after_flushing_l1(cluster, tok, reference):
    first = chat(tok, long_document() + "\n\nHow many boats does section 3 mention?")
    second = chat(tok, long_document() + "\n\nWhat does Brookvale trade?")
    shared = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b)
    assert shared > 1000
    cluster.generate(first, max_tokens=2)
    cluster.wait_idle("prefill")  # write-back of the prompt pages finished
    flushed = cluster.prefill_stub().Flush(pb.FlushRequest(), timeout=30).pages_freed
    assert flushed > 0
    got = cluster.generate(second, max_tokens=MAX_TOKENS)
    assert got.cached.store == shared // PAGE_SIZE * PAGE_SIZE
    assert got.cached.device == 0
    assert got.token_ids == reference([second])[0]
    cluster.assert_pools_sound()


def test_multiturn_offload_makes_turn_two_hit_prompt_and_answer(cluster, tok, reference):
    turn1, out1, turn2 = cluster.two_turns(tok, "Tell me a short story about a robot who learns to paint.",
                                           "Give the story a title.")
    got = cluster.generate(turn2, max_tokens=MAX_TOKENS)
    fed = len(turn1) + len(out1) - 1  # the last generated token is never fed, so never stored
    expected = min(fed // PAGE_SIZE, reusable_pages(len(turn2), PAGE_SIZE)) * PAGE_SIZE
    assert expected > len(turn1) // PAGE_SIZE * PAGE_SIZE  # the answer's pages count, not just the turn-1 prompt
    assert got.cached.store == expected and got.cached.device == 0
    assert got.token_ids == reference([turn2])[0]
    cluster.assert_pools_sound()


def test_sixteen_concurrent_mixed_length_requests(cluster, tok, reference):
    doc = long_document(30)
    prompts = [chat(tok, f"Request {i}: " + doc[: 20 + i * 60] + " Summarize.") for i in range(16)]
    max_tokens = [3 + i % 7 for i in range(16)]
    lengths = sorted(len(p) for p in prompts)
    assert lengths[0] < 60 and lengths[-1] > 220
    expected = reference(prompts, max_tokens)
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(cluster.generate, p, m) for p, m in zip(prompts, max_tokens)]
        results = [f.result(timeout=300) for f in futures]
    for i, (res, want) in enumerate(zip(results, expected)):
        assert res.token_ids == want, f"request {i} ({len(prompts[i])} tokens) diverged"
    cluster.assert_pools_sound()
