"""Bad input, by hand: what the fuzzing in test_router_fuzz.py found, and the cases the issue names
(invalid UTF-8, huge numbers, 10 MB bodies, prompts past the context, bad input_ids). Each answer is
a 4xx with an OpenAI-shaped error whose message and `param` name what is wrong; nothing reaches a
worker; the router stays healthy."""

from __future__ import annotations

import httpx
import pytest

from pdorch.local_stack.processes import free_port
from pdorch.local_stack.router import RouterThread, router_config
from pdorch.local_stack.standin import StandinServer

MODEL = "SmolLM2-135M-Instruct"
CHAT = "/v1/chat/completions"
VOCAB = 49152  # the tiny model's (SmolLM2's) vocabulary


def _chat(**extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **extra}


def _gen(**sampling) -> dict:
    return {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2, **sampling}}


# (name, path, body, status, param, words the message must contain)
CASES = [
    # numbers past the worker protocol's int32 / int64 fields (were a 500: protobuf's ValueError)
    ("seed past int64", CHAT, _chat(seed=2**63), 400, "seed", "64-bit signed integer"),
    ("seed below int64", "/v1/completions", {"prompt": "a", "seed": -(2**63) - 1}, 400, "seed", "64-bit"),
    ("sglang seed past int64", "/generate", _gen(seed=10**30), 400, "sampling_params.seed", "64-bit"),
    ("sglang sampling_seed", "/generate", _gen(sampling_seed=2**64), 400, "sampling_params.sampling_seed", "64-bit"),
    ("top_k past int32", CHAT, _chat(top_k=2**31), 400, "top_k", "top_k must be"),
    ("sglang top_k past int32", "/generate", _gen(top_k=10**12), 400, "sampling_params.top_k", "top_k must be"),
    ("stop token past int32", CHAT, _chat(stop_token_ids=[2**40]), 400, "stop_token_ids", "token ids in [0,"),
    ("sglang negative stop token", "/generate", _gen(stop_token_ids=[-1]), 400, "sampling_params.stop_token_ids",
     "token ids in [0,"),
    ("max_tokens huge", CHAT, _chat(max_tokens=10**30), 400, "max_tokens", "must be in [1, 2147483647]"),
    ("max_tokens zero", CHAT, _chat(max_tokens=0), 400, "max_tokens", "must be in [1,"),
    ("max_completion_tokens huge", CHAT, _chat(max_completion_tokens=2**31), 400, "max_completion_tokens",
     "must be in [1,"),
    ("max_new_tokens zero", "/generate", _gen(max_new_tokens=0), 400, "sampling_params.max_new_tokens",
     "must be in [1,"),
    ("max_tokens past the context", CHAT, _chat(max_tokens=5000), 400, "max_tokens", "exceeds the model's context"),
    ("number too long to parse", CHAT, b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1'
     + b"0" * 5000 + b"}", 400, None, "malformed JSON body"),
    ("float where an int belongs", CHAT, b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1e400}',
     400, "max_tokens", "valid integer"),
    ("NaN temperature", CHAT, b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', 400,
     "temperature", "got nan"),
    ("min_p above 1", CHAT, _chat(min_p=1.5), 400, "min_p", "min_p must be in [0, 1], got 1.5"),
    ("negative sglang min_p", "/generate", _gen(min_p=-0.1), 400, "sampling_params.min_p", "must be in [0, 1]"),
    ("Infinity top_p", CHAT, b'{"messages": [{"role": "user", "content": "hi"}], "top_p": Infinity}', 400,
     "top_p", "got inf"),
    # encodings
    ("invalid UTF-8 in a string", CHAT, b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', 400, None,
     "malformed JSON body"),
    ("lone surrogate escape", CHAT, b'{"messages": [{"role": "user", "content": "\\ud800"}]}', 400, None,
     "malformed JSON body"),
    ("UTF-16 body", CHAT, '{"messages": []}'.encode("utf-16"), 400, None, "malformed JSON body"),
    # types: a union names every accepted type
    ("prompt of the wrong type", "/v1/completions", {"prompt": 5}, 400, "prompt",
     "expected a string, an array of token ids"),
    ("content of the wrong type", CHAT, _chat(messages=[{"role": "user", "content": 5}]), 400,
     "messages.0.content", "expected a string or an array of"),
    ("content part of the wrong kind", CHAT, _chat(messages=[{"role": "user", "content": [{"type": "image"}]}]),
     400, "messages.0.content.0.type", "'text'"),
    ("stop of the wrong type", CHAT, _chat(stop=5), 400, "stop", "expected a string or an array of strings"),
    # prompts: empty, past the context, bad token ids
    ("chat past the context", CHAT, _chat(messages=[{"role": "user", "content": "hi " * 3000}]), 400, "messages",
     "the model's context is 2048 tokens"),
    ("text past the context", "/generate", {"text": "hi " * 3000}, 400, "input_ids",
     "the model's context is 2048 tokens"),
    ("input_ids empty", "/generate", {"input_ids": []}, 400, "input_ids", "the prompt is empty"),
    ("input_ids negative", "/generate", {"input_ids": [5, -3]}, 400, "input_ids", f"[0, {VOCAB})"),
    ("input_ids at the vocab size", "/generate", {"input_ids": [VOCAB]}, 400, "input_ids", f"got {VOCAB}"),
    ("input_ids huge", "/generate", {"input_ids": [10**30]}, 400, "input_ids", f"[0, {VOCAB})"),
    ("input_ids not integers", "/generate", {"input_ids": [1, 2.5]}, 400, "input_ids.1", "valid integer"),
    ("input_ids strings", "/generate", {"input_ids": ["1"]}, 400, "input_ids.0", "valid integer"),
    ("completion token ids past the vocab", "/v1/completions", {"prompt": [[1, VOCAB + 7]]}, 400, "prompt",
     f"got {VOCAB + 7}"),
    ("empty completion prompt", "/v1/completions", {"prompt": ""}, 400, "prompt", "the prompt is empty"),
    ("unknown model", CHAT, _chat(model="gpt-4o"), 404, "model", "'gpt-4o' is not served here"),
    ("model that looks like a path", CHAT, _chat(model="../../etc/passwd"), 404, "model", "is not served here"),
]


@pytest.fixture(scope="module")
def shared_router(router_tokenizer, tiny_model_dir):
    """One stand-in pair behind one router for all the cases (they change nothing)."""
    p, d = StandinServer("prefill", free_port()).start(), StandinServer("decode", free_port()).start()
    r = RouterThread(router_config([p.address], [d.address], policy="round_robin"), router_tokenizer,
                     tiny_model_dir).start()
    try:
        yield r, p, d
    finally:
        r.stop()
        p.stop()
        d.stop()
    assert len(d.behavior.calls) == 0


@pytest.mark.parametrize("name,path,body,status,param,words", CASES, ids=[c[0] for c in CASES])
def test_bad_input_names_what_is_wrong(shared_router, name, path, body, status, param, words):
    r, _, d = shared_router
    calls_before = len(d.behavior.calls)
    kwargs = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, bytes) \
        else {"json": body}
    resp = httpx.post(r.url + path, timeout=20, **kwargs)
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert err["param"] == param, err
    assert words in err["message"], err
    assert "Traceback" not in resp.text
    assert len(d.behavior.calls) == calls_before  # nothing reached a worker


def test_ten_megabyte_bodies_are_a_clear_413_declared_or_chunked(pd_router):
    r, _, d = pd_router
    body = b'{"text": "' + b"a" * (10 << 20) + b'"}'
    declared = httpx.post(r.url + "/generate", content=body, headers={"content-type": "application/json"},
                          timeout=60)

    def chunks():
        for i in range(0, len(body), 1 << 20):
            yield body[i:i + (1 << 20)]

    chunked = httpx.post(r.url + "/generate", content=chunks(), headers={"content-type": "application/json"},
                         timeout=60)
    for resp in (declared, chunked):
        assert resp.status_code == 413, resp.text
        err = resp.json()["error"]
        assert err["message"] == "request body larger than 8 MiB (router.max_body_mb)"
        assert err["type"] == "invalid_request_error" and err["code"] == "request_too_large"
    assert d.behavior.calls == []
    ok = httpx.post(r.url + "/generate", json=_gen(), timeout=20)
    assert ok.status_code == 200, ok.text


def test_the_body_limit_is_configurable(standins, make_router):
    p, d = standins("prefill"), standins("decode")
    r = make_router([p.address], [d.address], policy="round_robin", max_body_mb=1)
    big = {"input_ids": [1] * 600_000}  # ~1.2 MB of JSON
    resp = httpx.post(r.url + "/generate", json=big, timeout=30)
    assert resp.status_code == 413 and "larger than 1 MiB" in resp.json()["error"]["message"]
    assert httpx.post(r.url + "/generate", json=_gen(), timeout=20).status_code == 200
