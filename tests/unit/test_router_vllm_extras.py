"""vLLM's extra request fields in the router (router/http/bodies.py, body_sampling.py, logprobs.py): what
reaches the decode worker's SamplingParams, checked on a stand-in worker behind the real router, and
the answers' prompt_logprobs. The workers' side is in test_token_masks.py, test_engine_stop.py and
tests/integration/test_sampling_fields.py."""

from __future__ import annotations

import httpx
import pytest

from engine.tokenizer import Tokenizer
from proto.pdorch.v1 import worker_pb2
from router.http.bodies import GenerateRequest
from router.http.body_sampling import bad_words_ids, sampling_from_sglang
from router.http.logprobs import with_prompt_logprobs

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture
def sent(pd_router):
    """post(path, body) -> the GenerateRequest the decode worker got (the answer must be a 200)."""
    r, _, d = pd_router

    def post(path: str, body: dict) -> worker_pb2.GenerateRequest:
        resp = httpx.post(r.url + path, json={"max_tokens": 3, **body}, timeout=20)
        assert resp.status_code == 200, resp.text
        post.answer = resp.json()
        return d.behavior.calls[-1]

    return post


def test_the_output_fields_and_token_masks_reach_the_decode_worker(sent, router_tokenizer):
    fields = {"include_stop_str_in_output": True, "skip_special_tokens": False, "spaces_between_special_tokens": False,
              "allowed_token_ids": [5, 9, 300], "bad_words": ["sea", "the moon"]}
    for path, body in (("/v1/chat/completions", {"messages": MESSAGES}), ("/v1/completions", {"prompt": "hi"})):
        s = sent(path, {**body, **fields}).sampling
        assert s.include_stop_str_in_output and s.HasField("skip_special_tokens") and not s.skip_special_tokens
        assert s.HasField("spaces_between_special_tokens") and not s.spaces_between_special_tokens
        assert list(s.allowed_token_ids) == [5, 9, 300]
        assert [list(w.ids) for w in s.bad_words] == bad_words_ids(["sea", "the moon"], router_tokenizer)
    plain = sent("/v1/chat/completions", {"messages": MESSAGES}).sampling
    assert not plain.HasField("skip_special_tokens") and not plain.HasField("spaces_between_special_tokens")
    assert not plain.include_stop_str_in_output and not plain.allowed_token_ids and not plain.bad_words


def test_bad_words_are_tokenized_as_vllm_does(router_tokenizer):
    """The word as written (leading blanks dropped) and, where it is another word of the same length,
    with a leading space: "sea" and " sea" are distinct single tokens."""
    tok = router_tokenizer
    enc = lambda text: tok.encode(text, add_special_tokens=False)
    assert bad_words_ids(["sea"], tok) == [enc("sea"), enc(" sea")] and enc("sea") != enc(" sea")
    assert bad_words_ids(["  sea"], tok) == bad_words_ids(["sea"], tok)
    long = bad_words_ids(["the moon"], tok)
    assert long[0] == enc("the moon") and all(len(w) == len(long[0]) for w in long)


def test_prompt_logprobs_request_id_and_session_id_reach_the_job(sent, pd_router):
    g = sent("/v1/chat/completions", {"messages": MESSAGES, "prompt_logprobs": 2, "request_id": "trace-7"})
    assert g.sampling.prompt_logprobs == 2 and g.request_id == "trace-7" and sent.answer["id"] == "chatcmpl-trace-7"
    echo = sent("/v1/completions", {"prompt": "hi", "echo": True, "logprobs": 1, "prompt_logprobs": 3}).sampling
    assert echo.prompt_logprobs == 3  # echo's own need (1) and prompt_logprobs' (3): the larger
    assert not sent("/v1/completions", {"prompt": "hi"}).sampling.HasField("prompt_logprobs")


def test_a_session_id_keeps_a_session_on_one_prefill_worker(standins, make_router):
    ps, d = [standins("prefill"), standins("prefill")], standins("decode")
    r = make_router([p.address for p in ps], [d.address], policy="round_robin")
    body = {"messages": MESSAGES, "max_tokens": 2}
    for extra in ({"session_id": "s1"}, {}):
        for _ in range(4):
            assert httpx.post(r.url + "/v1/chat/completions", json={**body, **extra}, timeout=20).status_code == 200
    pinned, free = {c.prefill_address for c in d.behavior.calls[:4]}, {c.prefill_address for c in d.behavior.calls[4:]}
    assert len(pinned) == 1 and len(free) == 2


def test_chat_template_fields_and_message_parts_shape_the_prompt(sent, router_tokenizer):
    """chat_template_kwargs and add_generation_prompt reach the template; text parts and `name` are read."""
    parts = [{"role": "user", "name": "ada", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "x"}]}]
    g = sent("/v1/chat/completions", {"messages": parts, "add_generation_prompt": False,
                                      "chat_template_kwargs": {"extra_note": 1}})
    expected = router_tokenizer.encode_chat([{"role": "user", "name": "ada", "content": "hi x"}], False, extra_note=1)
    assert list(g.token_ids) == expected
    assert list(sent("/v1/chat/completions", {"messages": parts}).token_ids) != expected  # with the generation prompt


@pytest.mark.parametrize("fields, param, words", [
    ({"allowed_token_ids": []}, "allowed_token_ids", "non-empty array of token ids"),
    ({"allowed_token_ids": [-1]}, "allowed_token_ids", "non-empty array of token ids"),
    ({"allowed_token_ids": [10**6]}, "allowed_token_ids", "not in the model's vocabulary"),
    ({"bad_words": [" "]}, "bad_words", "non-empty words"),
    ({"bad_words": ["w"] * 257}, "bad_words", "at most 256 words"),
    ({"prompt_logprobs": 21}, "prompt_logprobs", "must be in [0, 20]"),
    ({"prompt_logprobs": 0, "stream": True}, "prompt_logprobs", "not available when stream=true"),
    ({"request_id": ""}, "request_id", "1 to 128 printable characters"),
    ({"skip_special_tokens": "no"}, "skip_special_tokens", "valid boolean"),
])
def test_bad_extras_are_a_400_naming_the_field(pd_router, fields, param, words):
    r, _, d = pd_router
    resp = httpx.post(r.url + "/v1/chat/completions", json={"messages": MESSAGES, **fields}, timeout=20)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == param, resp.text
    assert words in resp.json()["error"]["message"] and not d.behavior.calls


def test_sglang_spells_them_its_own_way():
    s, _ = sampling_from_sglang(GenerateRequest.model_validate(
        {"text": "x", "sampling_params": {"skip_special_tokens": False, "no_stop_trim": True,
                                          "spaces_between_special_tokens": False}}).sampling_params)
    assert s.HasField("skip_special_tokens") and not s.skip_special_tokens and s.include_stop_str_in_output
    assert not s.spaces_between_special_tokens


def test_prompt_logprobs_take_vllms_shape_in_each_route(tiny_model_dir):
    """Per prompt position {token id: {logprob, rank, decoded_token}}: the prompt's token first (its
    rank from the worker), then the top alternatives ranked 1..k; position 0 null."""
    tok = Tokenizer.from_dir(tiny_model_dir)
    ids = tok.encode("The sea", add_special_tokens=False)
    lps = [worker_pb2.TokenLogprob(logprob=-2.5, top_ids=[ids[1], 7], top_logprobs=[-2.5, -3.0], rank=1)]
    chat = with_prompt_logprobs({"choices": [{}]}, True, tok, ids, lps, 2)
    assert chat["prompt_logprobs"] == [None, {
        str(ids[1]): {"logprob": -2.5, "rank": 1, "decoded_token": tok.decode([ids[1]])},
        "7": {"logprob": -3.0, "rank": 2, "decoded_token": tok.decode([7])}}]
    lps[0].top_ids[:] = [7]
    lps[0].top_logprobs[:] = [-0.1]
    lps[0].rank = 4
    done = with_prompt_logprobs({"choices": [{"index": 0}, {"index": 1}]}, False, tok, ids, lps, 0)
    assert [c["prompt_logprobs"] for c in done["choices"]] == [[None, {str(ids[1]): {
        "logprob": -2.5, "rank": 4, "decoded_token": tok.decode([ids[1]])}}]] * 2  # k = 0: the token alone
    assert "prompt_logprobs" not in done


def test_a_resumed_streams_text_keeps_the_output_fields(router_tokenizer):
    """The router replays the streamed tokens through the decode worker's stop checker (failover.py): it
    must write the text as the worker did (special tokens kept, the stop string kept)."""
    from types import SimpleNamespace

    from router.dispatch.failover import Resumption

    tok = router_tokenizer
    streamed = tok.encode("<|im_start|>The sea", add_special_tokens=False)
    rest = tok.encode(" is calm. END and more", add_special_tokens=False)
    sampling = worker_pb2.SamplingParams(max_tokens=40, stop=["END"], include_stop_str_in_output=True,
                                         skip_special_tokens=False, allowed_token_ids=[5], min_tokens=3)
    job = SimpleNamespace(sampling=sampling, token_ids=[1, 2], request_id="r", page_hashes=[])
    resumed = Resumption(tok, job, streamed, 16, 1)
    assert list(resumed.sampling.allowed_token_ids) == [5] and resumed.sampling.include_stop_str_in_output
    assert resumed.sampling.min_tokens == max(0, 3 - len(streamed))
    (out,) = resumed.rewrite([worker_pb2.GenerateResponse(token_ids=rest)])
    assert out.finish_reason == "stop" and out.matched_stop == "END"
    assert resumed.checker.output_text == "<|im_start|>The sea is calm. END"
