"""HTTP API schema against stand-in workers: OpenAI client (chat + completions, stream or not),
SGLang /generate chunks, info/health/metrics/admin routes, and what D is asked to do."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from pdorch.local_stack.router import wait_until

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture
def client(pd_router):
    r, _, d = pd_router
    d.behavior.cached_device, d.behavior.cached_store = 16, 32
    return openai.OpenAI(base_url=r.url + "/v1", api_key="unused", max_retries=0, timeout=20)


def _sse(resp: httpx.Response) -> list:
    events = []
    for line in resp.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def test_chat_non_streaming_with_usage_and_cached_tokens(client, pd_router, router_tokenizer):
    _, p, d = pd_router
    out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello!"}],
                                         max_tokens=3, temperature=0, seed=7)
    assert out.object == "chat.completion" and out.model == MODEL
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == " w0 w1 w2"
    assert out.choices[0].finish_reason == "length"
    expected_ids = router_tokenizer.encode_chat([{"role": "user", "content": "Hello!"}])
    assert out.usage.prompt_tokens == len(expected_ids)
    assert out.usage.completion_tokens == 3 and out.usage.total_tokens == len(expected_ids) + 3
    assert out.usage.prompt_tokens_details.cached_tokens == 48
    req = d.behavior.calls[-1]
    assert list(req.token_ids) == expected_ids  # chat template applied by the router
    assert req.prefill_address == p.address
    assert req.sampling.max_tokens == 3 and req.sampling.temperature == 0 and req.sampling.seed == 7


def test_chat_without_model_is_served_by_the_served_model(pd_router):
    r, _, _ = pd_router
    resp = httpx.post(r.url + "/v1/chat/completions", timeout=20,
                      json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    assert resp.status_code == 200, resp.text
    assert resp.json()["model"] == MODEL


def test_chat_streaming_with_include_usage(client):
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                            max_tokens=4, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == " w0 w1 w2 w3"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 48
    assert all(c.usage is None for c in chunks[:-1])


def test_continuous_usage_stats_puts_the_usage_so_far_on_every_chunk(client):
    # vLLM's stream_options.continuous_usage_stats (with include_usage): running totals on each chunk.
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                            max_tokens=4, stream=True, extra_body={"stream_options": {
                                                "include_usage": True, "continuous_usage_stats": True}})
    chunks = list(stream)
    content = [c for c in chunks if c.choices]
    assert all(c.usage is not None for c in chunks)
    counts = [c.usage.completion_tokens for c in content]
    assert counts == sorted(counts) and counts[-1] == 4 and counts[0] >= 1
    assert all(c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens for c in chunks)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4


def test_completions_text_and_token_prompts(client, pd_router, router_tokenizer):
    _, _, d = pd_router
    out = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=2)
    assert out.object == "text_completion" and out.choices[0].text == " w0 w1"
    assert list(d.behavior.calls[-1].token_ids) == router_tokenizer.encode("Once upon a time")
    stream = client.completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=3, stream=True)
    assert "".join(c.choices[0].text for c in stream) == " w0 w1 w2"
    assert list(d.behavior.calls[-1].token_ids) == [5, 6, 7]


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list()] == [MODEL]


def _generate_stream(url: str) -> list:
    body = {"input_ids": list(range(1, 41)), "sampling_params": {"temperature": 0.0, "max_new_tokens": 4,
            "ignore_eos": True}, "stream": True, "stream_options": {"include_usage": True}, "lora_path": "",
            "return_logprob": False, "logprob_start_len": -1}  # what SGLang's bench_multiturn sends
    with httpx.stream("POST", url + "/generate", json=body, timeout=20) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        events = _sse(resp)
    assert events[-1] == "[DONE]"
    return events[:-1]


def test_generate_streaming_chunks_are_cumulative_with_meta_info(pd_router):
    r, _, d = pd_router
    d.behavior.cached_device, d.behavior.cached_store = 16, 16
    d.behavior.token_delay_s = 0.1  # tokens arrive one by one, like decode steps
    chunks = _generate_stream(r.url)
    assert [c["output_ids"] for c in chunks] == [[1000], [1000, 1001], [1000, 1001, 1002],
                                                 [1000, 1001, 1002, 1003]]
    assert [c["text"] for c in chunks] == [" w0", " w0 w1", " w0 w1 w2", " w0 w1 w2 w3"]
    for i, c in enumerate(chunks):
        m = c["meta_info"]
        assert m["prompt_tokens"] == 40 and m["completion_tokens"] == i + 1
        assert m["cached_tokens"] == 32
        assert m["cached_tokens_details"] == {"device": 16, "host": 0, "store": 16, "ssd": 0, "inflight": 0}
    assert chunks[0]["meta_info"]["finish_reason"] is None
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    sent = d.behavior.calls[-1]
    assert sent.sampling.ignore_eos and sent.sampling.max_tokens == 4


def test_generate_tokens_that_arrive_together_share_a_chunk_and_stay_cumulative(pd_router):
    r, _, _ = pd_router
    counts = []
    for _ in range(10):  # no delay: the stand-in's tokens usually reach the router in one read
        chunks = _generate_stream(r.url)
        counts.append(len(chunks))
        assert 1 <= len(chunks) <= 4
        previous: list = []
        for c in chunks:
            ids = c["output_ids"]
            assert len(ids) > len(previous) and ids[:len(previous)] == previous  # grows, never rewrites
            assert c["text"] == "".join(f" w{t - 1000}" for t in ids)
            assert c["meta_info"]["completion_tokens"] == len(ids)
            previous = ids
        assert previous == [1000, 1001, 1002, 1003]
        assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    assert min(counts) < 4, counts


def test_generate_non_streaming_text_prompt(pd_router, router_tokenizer):
    r, _, d = pd_router
    out = httpx.post(r.url + "/generate", json={"text": "The capital of France is",
                                                "sampling_params": {"max_new_tokens": 2, "stop": ["\n"]}}).json()
    assert out["text"] == " w0 w1" and out["output_ids"] == [1000, 1001]
    assert out["meta_info"]["prompt_tokens"] == len(router_tokenizer.encode("The capital of France is"))
    assert list(d.behavior.calls[-1].sampling.stop) == ["\n"]
    out = httpx.post(r.url + "/generate", json={"input_ids": [3, 4]}).json()
    assert out["meta_info"]["completion_tokens"] == 128  # SGLang's default max_new_tokens


def test_info_health_metrics_workers_and_flush(pd_router):
    r, p, d = pd_router
    c = httpx.Client(base_url=r.url, timeout=20)
    info = c.get("/server_info").json()
    assert info["page_size"] == 16 and info["model"] == MODEL and info["max_context_tokens"] == 2048
    assert c.get("/health").json()["workers"]["prefill"]["routable"] == 1
    hg = c.get("/health_generate")
    assert hg.status_code == 200 and hg.json()["output_ids"] == [1000]
    assert d.behavior.calls[-1].sampling.max_tokens == 1
    flushed = c.post("/flush_cache").json()
    assert flushed["status"] == "ok" and p.behavior.flushes == 1 and d.behavior.flushes == 1
    assert sorted(w["pages_freed"] for w in flushed["workers"]) == [3, 5]
    workers = c.get("/workers").json()["workers"]
    assert {(w["role"], w["address"], w["healthy"]) for w in workers} == {
        ("prefill", p.address, True), ("decode", d.address, True)}
    c.post("/generate", json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}})
    text = c.get("/metrics").text
    assert 'pdorch_router_requests_total{route="/generate",status="200"}' in text
    assert "pdorch_router_ttft_seconds_bucket" in text and "pdorch_router_e2e_seconds_count" in text
    assert f'pdorch_router_worker_requests_total{{role="decode",worker="{d.address}"}}' in text
    assert 'pdorch_router_cached_tokens_total{tier="device"}' in text
    assert "pdorch_router_requests_in_flight 0.0" in text


def test_openapi_documents_request_bodies(pd_router):
    r, _, _ = pd_router
    spec = httpx.get(r.url + "/openapi.json").json()
    body = spec["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert "messages" in body["properties"] and "$ref" not in json.dumps(body)
    assert "input_ids" in spec["paths"]["/generate"]["post"]["requestBody"]["content"]["application/json"][
        "schema"]["properties"]


def test_min_p_reaches_the_decode_worker(pd_router):
    r, _, d = pd_router
    httpx.post(r.url + "/generate", json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1,
                                                                                      "min_p": 0.25}}, timeout=20)
    assert d.behavior.calls[-1].sampling.min_p == 0.25
    httpx.post(r.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                     "max_tokens": 1, "min_p": 0.5}, timeout=20)
    assert d.behavior.calls[-1].sampling.min_p == 0.5


def test_head_is_answered_where_get_is(pd_router):
    r, _, _ = pd_router
    for path in ("/metrics", "/v1/models", "/health"):
        resp = httpx.head(r.url + path, timeout=20)
        assert resp.status_code == 200, (path, resp.status_code)
        assert resp.content == b""
    assert httpx.head(r.url + "/v1/chat/completions", timeout=20).status_code == 405


def test_preemptions_on_the_decode_worker_reach_the_client_and_the_metrics(pd_router):
    r, _, d = pd_router
    d.behavior.preempted_at = (1, 3)  # two chunks say the stream was paused 0.5 s each
    chat = httpx.post(r.url + "/v1/chat/completions", timeout=20, json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).json()
    assert chat["usage"]["preemptions"] == 2 and chat["usage"]["completion_tokens"] == 4
    out = httpx.post(r.url + "/generate", timeout=20, json={"input_ids": [3, 4],
                                                            "sampling_params": {"max_new_tokens": 4}}).json()
    assert out["meta_info"]["preemptions"] == 2 and out["meta_info"]["preempted_s"] == 1.0
    d.behavior.preempted_at = ()
    out = httpx.post(r.url + "/generate", timeout=20, json={"input_ids": [3, 4],
                                                            "sampling_params": {"max_new_tokens": 4}}).json()
    assert out["meta_info"]["preemptions"] == 0
    metrics = httpx.get(r.url + "/metrics", timeout=20).text
    assert "pdorch_router_preemptions_total 4.0" in metrics


def test_a_request_the_decode_pool_could_never_hold_is_refused_and_a_default_max_tokens_fits(
        standins, make_router, router_tokenizer):
    p, d = standins("prefill"), standins("decode", total_pages=10)  # 160 tokens of KV
    r = make_router([p.address], [d.address], policy="round_robin")
    wait_until(lambda: any((w.get("info") or {}).get("total_pages") == 10 for w in
                           httpx.get(r.url + "/workers", timeout=20).json()["workers"]), 15, "the decode Info")
    prompt = [5] * 100
    too_long = httpx.post(r.url + "/v1/completions", timeout=20,
                          json={"model": MODEL, "prompt": prompt, "max_tokens": 61})
    assert too_long.status_code == 400
    err = too_long.json()["error"]
    assert err["param"] == "max_tokens" and "160 tokens" in err["message"] and "decode.num_pages" in err["message"]
    assert httpx.post(r.url + "/v1/completions", timeout=20,
                      json={"model": MODEL, "prompt": prompt, "max_tokens": 60}).status_code == 200
    assert d.behavior.calls[-1].sampling.max_tokens == 60
    # no max_tokens: the default (the rest of the context) is cut to what the pool holds
    default = httpx.post(r.url + "/v1/chat/completions", timeout=20,
                         json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    sent = d.behavior.calls[-1]
    assert default.status_code == 200 and len(sent.token_ids) + sent.sampling.max_tokens == 160
    huge = httpx.post(r.url + "/v1/completions", timeout=20, json={"model": MODEL, "prompt": [5] * 170})
    assert huge.status_code == 400 and "KV pool holds 160 tokens" in huge.json()["error"]["message"]
