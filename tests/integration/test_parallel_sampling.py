"""n > 1 on the real stack: the official `openai` client -> the real router -> D -> P (tiny
random-weights model, real mooncake_master, decode offload and prefix cache on).

One prefill and one KV push serve every sequence; D forks them sharing the prompt's pages
(decode_node/forks.py). Checked against independent runs: sequence i of a seeded request is the
n = 1 request with seed + i, so a wrong page copy, a shared page written, a generator or grammar
state taken from the wrong sequence shows up as different tokens.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from pdorch.local_stack.router import cluster_router
from pdorch.local_stack.workers import WorkerCluster, make_config
from store_client.master import MasterProcess

MODEL = None  # the served model
PAGE = 16


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, tiny_model_dir):
    tmp = tmp_path_factory.mktemp("parallel_sampling")
    master = MasterProcess(log_dir=str(tmp)).start()
    c = WorkerCluster(make_config(tmp, tiny_model_dir, master,
                                  decode={"offload_generated_kv": True, "prefix_cache": True,
                                          "num_pages": 256}), tmp, master)
    with c.stopped_on_failure():
        c.wait_ready(c.spawn_worker("prefill"), c.spawn_worker("decode"))
    yield c
    c.stop()


@pytest.fixture(scope="module")
def router(cluster, tiny_model_dir):
    r = cluster_router(cluster, tiny_model_dir, max_n=8)
    yield r
    r.stop()


@pytest.fixture(scope="module")
def client(router):
    return openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def prompt(k: int, length: int) -> list[int]:
    """A token-id prompt of its own (no page shared with another k's)."""
    return [(k * 7919 + i * 31) % 900 + 20 for i in range(length)]


@pytest.mark.parametrize("length", [37, 48])  # the last page partial / full (the first token opens a page)
def test_sequence_i_of_a_seeded_request_is_the_request_with_seed_plus_i(client, cluster, length):
    ids = prompt(length, length)
    kw = {"model": MODEL, "prompt": ids, "max_tokens": 40, "temperature": 1.0}
    many = client.completions.create(n=3, seed=100, extra_body={"ignore_eos": True}, **kw)
    assert [c.index for c in many.choices] == [0, 1, 2]
    alone = [client.completions.create(seed=100 + i, extra_body={"ignore_eos": True}, **kw).choices[0].text
             for i in range(3)]
    for i in range(3):
        assert many.choices[i].text == alone[i], (i, many.choices[i].text, alone[i])
    assert len(set(alone)) == 3  # three draws, not one copied
    assert many.usage.completion_tokens == 3 * 40 and many.usage.prompt_tokens == length
    again = client.completions.create(n=3, seed=100, extra_body={"ignore_eos": True}, **kw)
    assert [c.text for c in again.choices] == alone  # reproducible
    cluster.assert_pools_sound()


def test_a_streamed_n_request_equals_the_unstreamed_one_choice_by_choice(client):
    kw = {"model": MODEL, "messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 24,
              "temperature": 0.9, "seed": 7, "n": 3, "logprobs": True, "top_logprobs": 2}
    out = client.chat.completions.create(**kw)
    texts, roles, finishes, lps = {}, {}, {}, {}
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            if c.delta.role:
                assert c.index not in roles, "a second role delta"
                roles[c.index] = c.delta.role
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
            if c.logprobs and c.logprobs.content:
                lps.setdefault(c.index, []).extend(t.logprob for t in c.logprobs.content)
    assert texts == {c.index: c.message.content for c in out.choices}
    assert roles == {0: "assistant", 1: "assistant", 2: "assistant"}
    assert finishes == {c.index: c.finish_reason for c in out.choices}
    # NOTE: the same values up to float noise (the batch holds other rows than in the unstreamed run)
    assert set(lps) == {0, 1, 2}
    for c in out.choices:
        assert lps[c.index] == pytest.approx([t.logprob for t in c.logprobs.content], abs=1e-4)
    assert all(v <= 0 for c in out.choices for v in (t.logprob for t in c.logprobs.content))


def test_n_4_moves_the_bytes_of_n_1_from_prefill_to_decode(client, cluster):
    def pushed(ids, n) -> int:
        before = cluster.stats("prefill").transfer_bytes
        client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=1.0, seed=3, n=n)
        return cluster.stats("prefill").transfer_bytes - before

    one, four = pushed(prompt(1, 70), 1), pushed(prompt(2, 70), 4)
    assert one > 0 and four == one, (one, four)


def test_a_named_tool_choice_holds_in_every_choice(client):
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"unit": {"enum": ["c", "f"]}, "days": {"enum": [1, 2, 3]}},
        "required": ["unit", "days"], "additionalProperties": False}}}
    out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Weather?"}],
                                         tools=[tool], tool_choice={"type": "function",
                                                                    "function": {"name": "get_weather"}},
                                         max_tokens=120, temperature=1.0, seed=11, n=3)  # a hermes call with blanks: 40-60
    assert len(out.choices) == 3
    for c in out.choices:
        (call,) = c.message.tool_calls
        args = json.loads(call.function.arguments)
        assert c.finish_reason == "tool_calls" and args["unit"] in ("c", "f") and args["days"] in (1, 2, 3)


def test_generate_with_n_answers_a_list_and_streams_indexed_bodies(router):
    body = {"input_ids": prompt(5, 20), "sampling_params": {"max_new_tokens": 12, "temperature": 1.0, "seed": 5,
                                                             "n": 2, "ignore_eos": True}}
    out = httpx.post(router.url + "/generate", json=body, timeout=120).json()
    assert isinstance(out, list) and len(out) == 2 and all(len(b["output_ids"]) == 12 for b in out)
    last = {}
    with httpx.stream("POST", router.url + "/generate", json={**body, "stream": True}, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                event = json.loads(line[6:])
                last[event["index"]] = event
    assert [last[i]["output_ids"] for i in (0, 1)] == [b["output_ids"] for b in out]


def test_a_client_gone_mid_stream_frees_every_sequence(client, cluster):
    stream = client.completions.create(model=MODEL, prompt=prompt(9, 50), max_tokens=400, temperature=1.0, n=4,
                                       stream=True, extra_body={"ignore_eos": True})
    for i, _ in enumerate(stream):
        if i == 10:
            break
    stream.close()
    cluster.assert_pools_sound()


def test_n_above_the_pool_or_router_max_is_a_400_naming_n(client):
    for n, words in ((9, "router.max_n"), (8, "pool")):
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model=MODEL, prompt=prompt(3, 40), max_tokens=1000 if n == 8 else 4, n=n)
        assert e.value.body["param"] == "n" and words in e.value.body["message"], e.value.body
