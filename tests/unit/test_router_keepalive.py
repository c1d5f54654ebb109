"""SSE keep-alives through the router against stand-in workers (router/http/keepalive.py): a comment
line at once when the decode worker pauses a stream (its `paused` chunk: a preemption) and after every
`router.keepalive_s` of silence, on every streamed route; clients (the openai client) skip them."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from router.http.keepalive import KEEPALIVE

MODEL = "SmolLM2-135M-Instruct"
KEEPALIVE_S = 0.25


@pytest.fixture
def routed(standins, make_router):
    p, d = standins("prefill"), standins("decode")
    return make_router([p.address], [d.address], policy="round_robin", keepalive_s=KEEPALIVE_S), d


def events(body: bytes) -> list[bytes]:
    """The body's SSE events (comments included), each without its blank line."""
    return [e for e in body.split(b"\n\n") if e]


def data_json(event: bytes) -> dict:
    return json.loads(event[len(b"data: "):])


def test_a_paused_stream_gets_a_comment_at_once_and_on_every_silence_then_goes_on(routed):
    r, d = routed
    d.behavior.preempted_at, d.behavior.pause_s = (2,), 1.0  # paused before its third token, for 1 s
    body = httpx.post(r.url + "/v1/chat/completions", timeout=20, json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True,
        "stream_options": {"include_usage": True}}).content
    evs = events(body)
    kinds = [b"ka" if e + b"\n\n" == KEEPALIVE else b"data" for e in evs]
    first_ka, last_ka = kinds.index(b"ka"), len(kinds) - 1 - kinds[::-1].index(b"ka")
    # all between the second token's chunk and the third's: one at the pause, then one per 0.25 s of it
    contents = [data_json(e)["choices"][0]["delta"].get("content") for e in evs[:first_ka]]
    assert "".join(contents) == " w0 w1", evs  # (tokens that arrive together share a chunk)
    assert 3 <= kinds.count(b"ka") <= 5 and kinds[first_ka:last_ka + 1] == [b"ka"] * (last_ka - first_ka + 1), evs
    assert data_json(evs[last_ka + 1])["choices"][0]["delta"]["content"].startswith(" w2")  # w3 may come along
    usage = data_json(evs[-2])["usage"]  # then [DONE]
    assert usage["preemptions"] == 1 and usage["completion_tokens"] == 4


def test_the_openai_client_skips_the_comments(routed):
    r, d = routed
    d.behavior.preempted_at, d.behavior.pause_s = (1,), 0.6
    client = openai.OpenAI(base_url=r.url + "/v1", api_key="unused", max_retries=0, timeout=20)
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=3, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == " w0 w1 w2"
    assert chunks[-1].usage.preemptions == 1
    text = "".join(c.choices[0].text for c in client.completions.create(model=MODEL, prompt="hi", max_tokens=3,
                                                                         stream=True))
    assert text == " w0 w1 w2"


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/generate"])
def test_silence_between_tokens_gets_comments_on_every_streamed_route(routed, route):
    r, d = routed
    d.behavior.token_delay_s = 0.6  # no pause: the worker is only slow
    body = {"/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
            "/v1/completions": {"prompt": "hi", "max_tokens": 3},
            "/v1/responses": {"input": "hi", "max_output_tokens": 3},
            "/generate": {"input_ids": [3, 4], "sampling_params": {"max_new_tokens": 3}}}[route]
    out = httpx.post(r.url + route, timeout=20, json={"model": MODEL, "stream": True, **body}).content
    evs = events(out)
    kas = [i for i, e in enumerate(evs) if e + b"\n\n" == KEEPALIVE]
    assert len(kas) >= 2, evs  # two silences of 0.6 s: at least one comment in each
    assert kas[0] > 0 and kas[-1] < len(evs) - 1  # never before the first event nor after the last
    assert all(e.startswith((b"data: ", b"event: ")) for i, e in enumerate(evs) if i not in kas), evs


def test_keepalive_s_0_sends_none(standins, make_router):
    p, d = standins("prefill"), standins("decode")
    r = make_router([p.address], [d.address], policy="round_robin", keepalive_s=0.0)
    d.behavior.preempted_at, d.behavior.pause_s, d.behavior.token_delay_s = (1,), 0.3, 0.3
    out = httpx.post(r.url + "/generate", timeout=20, json={"input_ids": [3, 4], "stream": True,
                                                            "sampling_params": {"max_new_tokens": 3}}).content
    assert KEEPALIVE not in out and out.endswith(b"data: [DONE]\n\n")
    assert json.loads(events(out)[-2][len(b"data: "):])["meta_info"]["preemptions"] == 1
