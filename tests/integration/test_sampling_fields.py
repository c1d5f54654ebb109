"""vLLM's sampling-side fields through the real stack: the official `openai` client -> the real router ->
D -> P (tiny random-weights model, real mooncake_master, decode offload on). P samples the first token
and D the rest, so each field must hold on both; a stream whose decode worker is killed mid-way must
keep them on the new workers and in the router's replay of the text (router/dispatch/failover.py).

allowed_token_ids, bad_words, include_stop_str_in_output, skip_special_tokens, prompt_logprobs (chat
and completions), min_tokens under a grammar that may only end, and top_logprobs on completions refused.
"""

# ruff: noqa: F811  (the agent API's fixtures, imported below, are the tests' parameters)
from __future__ import annotations

import re

import httpx
import openai
import pytest

from engine.tokenizer import Tokenizer
from pdorch.local_stack.router import wait_until
from tests.integration.fault_helpers import iter_sse, kill_serving_decode
from tests.integration.test_agent_api import client, cluster, router  # noqa: F401  (P, 2 D, store, offload)

MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]
PROMPT = "The sea is"
MODEL = None  # the served model
IM_START = "<|im_start|>"  # a special token of the tiny model's (SmolLM2's) tokenizer


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return Tokenizer.from_dir(tiny_model_dir)


def one(tok, word: str) -> int:
    (token,) = tok.encode(word, add_special_tokens=False)
    return token


def test_allowed_token_ids_hold_on_the_first_token_and_the_rest(client, tok):
    words = [" sea", " sky", " moon"]
    for seed in (1, 2):
        out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=1.0, seed=seed,
                                        extra_body={"ignore_eos": True,
                                                    "allowed_token_ids": [one(tok, w) for w in words]})
        text = out.choices[0].text
        assert re.fullmatch("( sea| sky| moon){10}", text), text
    chat = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6, temperature=1.0, seed=3,
                                          extra_body={"ignore_eos": True, "allowed_token_ids": [one(tok, " sky")]})
    assert chat.choices[0].message.content == " sky" * 6


def test_bad_words_are_never_completed(client, tok):
    """Greedy, the tiny model's continuation starts with some word; banned, it appears nowhere."""
    kwargs = {"model": MODEL, "prompt": PROMPT, "max_tokens": 12, "temperature": 0, "logprobs": 0,
              "extra_body": {"ignore_eos": True}}
    plain = client.completions.create(**kwargs).choices[0].logprobs.tokens
    word = next(t.strip() for t in plain if re.fullmatch(r" ?[A-Za-z]{2,}", t))
    banned = client.completions.create(**{**kwargs, "extra_body": {"ignore_eos": True, "bad_words": [word]}})
    tokens = banned.choices[0].logprobs.tokens
    assert len(tokens) == 12 and word not in [t.strip() for t in tokens], (word, tokens)
    assert tokens != plain


def test_include_stop_str_in_output_keeps_the_stop_string_streamed_and_not(client):
    kwargs = {"model": MODEL, "prompt": PROMPT, "max_tokens": 16, "temperature": 0, "extra_body": {"ignore_eos": True}}
    plain = client.completions.create(**kwargs).choices[0].text
    stop = plain[len(plain) // 2:len(plain) // 2 + 3]
    at = plain.index(stop)
    for include, expected in ((False, plain[:at]), (True, plain[:at + len(stop)])):
        extra = {"ignore_eos": True, "include_stop_str_in_output": include}
        out = client.completions.create(**{**kwargs, "stop": [stop], "extra_body": extra}).choices[0]
        assert (out.text, out.finish_reason) == (expected, "stop"), (stop, include)
        streamed = "".join(c.choices[0].text for c in client.completions.create(
            **{**kwargs, "stop": [stop], "extra_body": extra}, stream=True) if c.choices)
        assert streamed == expected


def test_skip_special_tokens_false_keeps_them_in_the_text(client, tok):
    """A +100 bias makes every token <|im_start|> (P's first and D's rest): skipped by default, kept when asked."""
    bias = {str(one(tok, IM_START)): 100}
    kwargs = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4, "temperature": 0, "logit_bias": bias}
    assert client.chat.completions.create(**kwargs, extra_body={"ignore_eos": True}).choices[0].message.content == ""
    kept = client.chat.completions.create(**kwargs, extra_body={"ignore_eos": True, "skip_special_tokens": False})
    assert kept.choices[0].message.content == IM_START * 4
    stream = client.chat.completions.create(**kwargs, stream=True, extra_body={"ignore_eos": True,
                                                                             "skip_special_tokens": False})
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == IM_START * 4
    stop_token = client.chat.completions.create(**kwargs, extra_body={
        "skip_special_tokens": False, "stop_token_ids": [one(tok, IM_START)], "include_stop_str_in_output": True})
    assert (stop_token.choices[0].message.content, stop_token.choices[0].finish_reason) == (IM_START, "stop")


def test_prompt_logprobs_in_chat_and_completions_match_the_echoed_ones(client, router, tok):
    ids = tok.encode("The sea is calm and the sky is blue", add_special_tokens=False)
    done = client.completions.create(model=MODEL, prompt=ids, max_tokens=2, temperature=0,
                                     extra_body={"prompt_logprobs": 2})
    plps = done.choices[0].model_extra["prompt_logprobs"]
    echo = client.completions.create(model=MODEL, prompt=ids, max_tokens=2, temperature=0, logprobs=2, echo=True)
    echoed = echo.choices[0].logprobs.token_logprobs[:len(ids)]
    assert len(plps) == len(ids) and plps[0] is None and echoed[0] is None
    for t, entry, lp in zip(ids[1:], plps[1:], echoed[1:]):
        mine = entry[str(t)]
        assert mine["logprob"] == pytest.approx(lp, abs=1e-4) and mine["decoded_token"] == tok.decode([t])
        # the 2 most likely ranked 1, 2, and the prompt's token among them or after them (rank >= 3)
        by_rank = sorted((v["rank"], v["logprob"]) for v in entry.values())
        assert [r for r, _ in by_rank[:2]] == [1, 2] and len(by_rank) in (2, 3)
        assert [v for _, v in by_rank] == sorted((v for _, v in by_rank), reverse=True)
        assert len(by_rank) == 2 or mine["rank"] >= 3
    two = client.completions.create(model=MODEL, prompt=ids, max_tokens=2, n=2, extra_body={"prompt_logprobs": 2})
    assert [c.model_extra["prompt_logprobs"] for c in two.choices] == [plps, plps]  # one prefill: the same
    for n in (1, 2):
        resp = httpx.post(router.url + "/v1/chat/completions", timeout=120, json={
            "messages": MESSAGES, "max_tokens": 2, "temperature": 0, "prompt_logprobs": 0, "n": n})
        body = resp.json()
        prompt = tok.encode_chat(MESSAGES)
        assert len(body["prompt_logprobs"]) == body["usage"]["prompt_tokens"] == len(prompt)
        assert all(list(e) == [str(t)] for t, e in zip(prompt[1:], body["prompt_logprobs"][1:]))  # k = 0: the token


def test_min_tokens_under_a_grammar_that_may_only_end_ends_with_the_grammar(client):
    kwargs = {"model": MODEL, "messages": MESSAGES, "max_tokens": 20, "temperature": 1.0, "seed": 4,
              "extra_body": {"regex": "ab", "min_tokens": 5}}
    out = client.chat.completions.create(**kwargs).choices[0]
    assert (out.message.content, out.finish_reason) == ("ab", "stop")
    stream = client.chat.completions.create(**kwargs, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "ab"


def test_top_logprobs_on_completions_is_refused_by_name(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, logprobs=2, extra_body={"top_logprobs": 2})
    assert e.value.body["param"] == "top_logprobs" and "logprobs: <int>" in e.value.body["message"]


def test_a_stream_resumed_after_its_decode_worker_died_keeps_the_fields(cluster, router, tok):
    """kill -9 the decode worker after 12 chunks: the new P and D keep allowed_token_ids and bad_words
    (greedy: the whole text equals an uninterrupted run) and the router's replay keeps the special tokens."""
    allowed = [one(tok, w) for w in (" sea", " sky", " moon", IM_START)]
    body = {"prompt": PROMPT, "max_tokens": 400, "temperature": 0, "stream": True, "ignore_eos": True,
            "allowed_token_ids": allowed, "bad_words": ["moon"], "skip_special_tokens": False}

    def run(kill_after: int | None) -> str:
        pieces, killed = [], False
        with httpx.stream("POST", router.url + "/v1/completions", json=body, timeout=120) as resp:
            assert resp.status_code == 200, resp.read()
            for ev in iter_sse(resp.iter_lines()):
                assert "error" not in ev, ev
                pieces.append(ev["choices"][0]["text"])
                if kill_after is not None and not killed and len(pieces) >= kill_after:
                    assert not ev["choices"][0]["finish_reason"]
                    kill_serving_decode(router, cluster)
                    killed = True
        assert kill_after is None or killed
        return "".join(pieces)

    resumed = run(kill_after=12)
    assert re.fullmatch(r"( sea| sky|<\|im_start\|>){400}", resumed), resumed[:200]
    text = httpx.get(router.url + "/metrics", timeout=30).text
    assert re.search(r'^pdorch_router_failovers_total\{outcome="resumed"\} 1\.0$', text, re.MULTILINE)
    wait_until(lambda: sum(w["healthy"] for w in httpx.get(router.url + "/workers", timeout=30).json()["workers"]
                           if w["role"] == "decode") == 1, 30, "the dead decode worker marked unhealthy")
    assert run(kill_after=None) == resumed
