"""Bad input and unavailable capacity: the stated status code, OpenAI-shaped JSON, router still healthy."""

from __future__ import annotations

import threading

import httpx
import pytest

MODEL = "SmolLM2-135M-Instruct"
CHAT = "/v1/chat/completions"


def _chat(**extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **extra}


BAD_INPUTS = [
    ("malformed json", CHAT, b'{"model": "x", "messages": [', None),
    ("empty body", CHAT, b"", None),
    ("body not an object", CHAT, b"[1, 2]", None),
    ("missing messages", CHAT, {"model": MODEL}, "messages"),
    ("empty messages", CHAT, _chat(messages=[]), "messages"),
    ("bad role", CHAT, _chat(messages=[{"role": "robot", "content": "x"}]), "messages.0.role"),
    ("temperature wrong type", CHAT, _chat(temperature="hot"), "temperature"),
    ("max_tokens wrong type", CHAT, _chat(max_tokens="5"), "max_tokens"),
    ("stream wrong type", CHAT, _chat(stream="yes"), "stream"),
    ("negative temperature", CHAT, _chat(temperature=-1), "temperature"),
    ("top_p zero", CHAT, _chat(top_p=0), "top_p"),
    ("top_p above one", CHAT, _chat(top_p=1.5), "top_p"),
    ("top_k below -1", CHAT, _chat(top_k=-5), "top_k"),
    ("max_tokens zero", CHAT, _chat(max_tokens=0), "max_tokens"),
    ("n above router.max_n", CHAT, _chat(n=1000), "n"),
    ("n zero", CHAT, _chat(n=0), "n"),
    ("top_logprobs", CHAT, _chat(logprobs=True, top_logprobs=21), "top_logprobs"),
    ("top_logprobs_alone", CHAT, _chat(top_logprobs=2), "top_logprobs"),
    ("too many stops", CHAT, _chat(stop=["a"] * 17), "stop"),
    ("prompt longer than context", "/v1/completions", {"model": MODEL, "prompt": [1] * 2048}, "prompt"),
    ("prompt + max_tokens over context", "/v1/completions",
     {"model": MODEL, "prompt": [1] * 2000, "max_tokens": 100}, "max_tokens"),
    ("batched prompts", "/v1/completions", {"model": MODEL, "prompt": ["a", "b"]}, "prompt"),
    ("empty token prompt", "/v1/completions", {"model": MODEL, "prompt": []}, "prompt"),
    ("token id out of vocab", "/v1/completions", {"model": MODEL, "prompt": [10**9]}, "prompt"),
    ("generate without prompt", "/generate", {"sampling_params": {}}, "text"),
    ("generate with both prompts", "/generate", {"text": "a", "input_ids": [1]}, "text"),
    ("generate input_ids wrong type", "/generate", {"input_ids": "1 2 3"}, "input_ids"),
    ("generate bad max_new_tokens", "/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": -1}},
     "sampling_params.max_new_tokens"),
    ("generate bad sampling type", "/generate", {"input_ids": [1], "sampling_params": {"top_k": 1.5}},
     "sampling_params.top_k"),
]


@pytest.mark.parametrize("name,path,body,param", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_is_a_400_with_openai_error_json(pd_router, name, path, body, param):
    r, _, d = pd_router
    calls_before = len(d.behavior.calls)
    kwargs = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, bytes) \
        else {"json": body}
    resp = httpx.post(r.url + path, timeout=20, **kwargs)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["message"]
    assert "Traceback" not in resp.text
    if param is not None:
        assert err["param"] == param
    assert len(d.behavior.calls) == calls_before  # nothing reached a worker
    assert httpx.get(r.url + "/health").status_code == 200
    ok = httpx.post(r.url + "/generate", json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}})
    assert ok.status_code == 200


def test_a_model_not_served_is_a_404_model_not_found(pd_router):
    # As OpenAI and vLLM answer: 404 with code model_not_found, and no worker is asked.
    r, _, d = pd_router
    calls_before = len(d.behavior.calls)
    resp = httpx.post(r.url + CHAT, timeout=20, json=_chat(model="gpt-4"))
    assert resp.status_code == 404, resp.text
    err = resp.json()["error"]
    assert (err["param"], err["code"], err["type"]) == ("model", "model_not_found", "invalid_request_error")
    assert "'gpt-4' is not served here" in err["message"]
    assert len(d.behavior.calls) == calls_before


def test_unknown_route_and_method_are_openai_shaped(pd_router):
    r, _, _ = pd_router
    assert httpx.get(r.url + "/v2/nothing").json()["error"]["code"] == 404
    resp = httpx.get(r.url + CHAT)
    assert resp.status_code == 405 and resp.json()["error"]["type"] == "invalid_request_error"


def test_api_key_and_admin_key(standins, make_router):
    p, d = standins("prefill"), standins("decode")
    r = make_router([p.address], [d.address], policy="round_robin", api_key="sk-client", admin_key="sk-admin")
    c = httpx.Client(base_url=r.url, timeout=20)
    assert c.post(CHAT, json=_chat()).status_code == 401
    resp = c.post(CHAT, json=_chat(), headers={"Authorization": "Bearer wrong"})
    assert resp.status_code == 401 and resp.json()["error"]["type"] == "authentication_error"
    assert "sk-client" not in resp.text
    assert c.post(CHAT, json=_chat(), headers={"Authorization": "Bearer sk-client"}).status_code == 200
    assert c.get("/workers", headers={"Authorization": "Bearer sk-client"}).status_code == 403
    assert c.post("/flush_cache", headers={"Authorization": "Bearer sk-client"}).status_code == 403
    assert c.post("/flush_cache").status_code == 401
    assert c.get("/workers", headers={"Authorization": "Bearer sk-admin"}).status_code == 200
    assert c.post("/flush_cache", headers={"Authorization": "Bearer sk-admin"}).status_code == 200
    assert c.get("/health").status_code == 200  # probes stay open


def test_no_healthy_decode_is_503_with_retry_after(standins, make_router):
    p, d = standins("prefill"), standins("decode")
    r = make_router([p.address], [d.address], policy="round_robin")
    d.stop()
    deadline_checks = 0
    while httpx.get(r.url + "/health").status_code == 200:  # health loop runs every 0.3 s
        deadline_checks += 1
        assert deadline_checks < 100, "router never noticed the decode worker was gone"
        threading.Event().wait(0.05)
    resp = httpx.post(r.url + CHAT, json=_chat(), timeout=20)
    assert resp.status_code == 503 and int(resp.headers["retry-after"]) >= 1
    assert "decode" in resp.json()["error"]["message"]
    assert httpx.get(r.url + "/health").headers["retry-after"]


def test_queue_limit_is_429(standins, make_router):
    p, d = standins("prefill"), standins("decode", first_token_delay_s=1.5)
    r = make_router([p.address], [d.address], policy="round_robin", max_queued_requests=2)
    results = []

    def slow():
        results.append(httpx.post(r.url + "/generate", json={"input_ids": [1], "sampling_params":
                                  {"max_new_tokens": 1}}, timeout=20).status_code)

    threads = [threading.Thread(target=slow) for _ in range(2)]
    for t in threads:
        t.start()
    for _ in range(100):  # wait until both are in flight
        if len(d.behavior.calls) == 2:
            break
        threading.Event().wait(0.02)
    resp = httpx.post(r.url + "/generate", json={"input_ids": [1]}, timeout=20)
    assert resp.status_code == 429 and resp.headers["retry-after"]
    assert resp.json()["error"]["type"] == "rate_limit_exceeded"
    for t in threads:
        t.join(timeout=20)
    assert results == [200, 200]
    assert httpx.post(r.url + "/generate", json={"input_ids": [1], "sampling_params": {"max_new_tokens": 1}},
                      timeout=20).status_code == 200


def test_oversized_body_is_a_413(pd_router):
    from router.http.hot_path import MAX_BODY_BYTES

    r, _, _ = pd_router
    resp = httpx.post(r.url + "/generate", content=b"[" + b"1," * (MAX_BODY_BYTES // 2) + b"1]",
                      headers={"content-type": "application/json"}, timeout=60)
    assert resp.status_code == 413 and "larger than" in resp.json()["error"]["message"]
    assert httpx.get(r.url + "/health").status_code == 200
