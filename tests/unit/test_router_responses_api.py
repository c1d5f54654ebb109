"""`/v1/responses` through the router against stand-in workers: the official `openai` client streamed and
not, every streamed event and every Response parsed with the SDK's types, the prompt D is sent, stored
responses and chains (GET, DELETE, 404), a chain's turns on one prefill worker, bad input."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

MODEL = "SmolLM2-135M-Instruct"
EVENT = TypeAdapter(ResponseStreamEvent)


@pytest.fixture
def client(pd_router):
    r, _, d = pd_router
    d.behavior.cached_device, d.behavior.cached_store = 16, 32
    return openai.OpenAI(base_url=r.url + "/v1", api_key="unused", max_retries=0, timeout=20)


def events_of(resp: httpx.Response) -> list[dict]:
    """The SSE events of a response body, each `event:` line checked against its data's type."""
    out, name = [], None
    for line in resp.iter_lines():
        if line.startswith("event: "):
            name = line[len("event: "):]
        elif line.startswith("data: "):
            event = json.loads(line[len("data: "):])
            assert event["type"] == name
            out.append(event)
    return out


def post(r, body: dict, **kwargs) -> httpx.Response:
    return httpx.post(r.url + "/v1/responses", json=body, timeout=20, **kwargs)


def test_a_response_is_the_chat_prompt_answered_with_usage_and_cached_tokens(client, pd_router, router_tokenizer):
    r, _, d = pd_router
    out = client.responses.create(model=MODEL, input="Hello!", instructions="Be brief.", max_output_tokens=3,
                                  temperature=0, top_p=0.5, metadata={"task": "t1"})
    assert out.object == "response" and out.id.startswith("resp_") and out.model == MODEL
    assert out.output_text == " w0 w1 w2" and out.status == "incomplete"  # the stand-in stops at max tokens
    assert out.incomplete_details.reason == "max_output_tokens" and out.metadata == {"task": "t1"}
    expected = router_tokenizer.encode_chat([{"role": "system", "content": "Be brief."},
                                             {"role": "user", "content": "Hello!"}])
    req = d.behavior.calls[-1]
    assert list(req.token_ids) == expected
    assert (req.sampling.max_tokens, req.sampling.temperature, round(req.sampling.top_p, 3)) == (3, 0, 0.5)
    assert (out.usage.input_tokens, out.usage.output_tokens) == (len(expected), 3)
    assert out.usage.input_tokens_details.cached_tokens == 48 and out.usage.total_tokens == len(expected) + 3
    raw = post(r, {"input": "Hello!", "max_output_tokens": 2})
    assert raw.status_code == 200 and raw.headers["content-type"] == "application/json"
    assert Response.model_validate(raw.json()).output[0].content[0].text == " w0 w1"


def test_a_streamed_response_is_openais_events_in_order(client, pd_router):
    r, _, _ = pd_router
    with httpx.stream("POST", r.url + "/v1/responses", json={"input": "Hi", "max_output_tokens": 4, "stream": True},
                      timeout=20) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"] == "text/event-stream"
        events = events_of(resp)
    parsed = [EVENT.validate_python(e) for e in events]
    assert [e.sequence_number for e in parsed] == list(range(len(parsed)))
    kinds = [e.type for e in parsed]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert "".join(e.delta for e in parsed[4:-4]) == " w0 w1 w2 w3" == parsed[-4].text
    final = parsed[-1].response
    assert final.output_text == " w0 w1 w2 w3" and final.usage.input_tokens_details.cached_tokens == 48
    assert parsed[0].response.id == final.id and parsed[0].response.status == "in_progress"
    # the official client reads the same stream (the deltas may batch otherwise: tokens that arrive together)
    sdk = list(client.responses.create(model=MODEL, input="Hi", max_output_tokens=4, stream=True))
    assert [e.type for e in sdk if e.type != "response.output_text.delta"] == kinds[:4] + kinds[-4:]
    assert sdk[-1].response.output_text == " w0 w1 w2 w3"


def test_previous_response_id_continues_the_stored_conversation(client, pd_router, router_tokenizer):
    r, _, d = pd_router
    one = client.responses.create(model=MODEL, input="one", instructions="Count.", max_output_tokens=2)
    two = client.responses.create(model=MODEL, input=[{"role": "user", "content": "two"}], max_output_tokens=2,
                                  previous_response_id=one.id)
    assert two.previous_response_id == one.id
    # instructions are not carried to the next turn (OpenAI's rule); the earlier output is an assistant turn
    expected = router_tokenizer.encode_chat([{"role": "user", "content": "one"},
                                             {"role": "assistant", "content": " w0 w1"},
                                             {"role": "user", "content": "two"}])
    assert list(d.behavior.calls[-1].token_ids) == expected
    three = client.responses.create(model=MODEL, input="three", max_output_tokens=1, previous_response_id=two.id)
    assert len(d.behavior.calls[-1].token_ids) > len(expected) and three.output_text == " w0"
    got = httpx.get(r.url + f"/v1/responses/{two.id}", timeout=20)
    assert got.status_code == 200 and Response.model_validate(got.json()) == two
    assert client.responses.retrieve(three.id).output_text == " w0"
    gone = httpx.delete(r.url + f"/v1/responses/{two.id}", timeout=20)
    assert gone.json() == {"id": two.id, "object": "response.deleted", "deleted": True}
    assert httpx.get(r.url + f"/v1/responses/{two.id}", timeout=20).status_code == 404
    err = post(r, {"input": "four", "previous_response_id": three.id}).json()["error"]
    assert err["code"] == "previous_response_not_found" and "no longer stored" in err["message"]


def test_store_false_keeps_nothing(client, pd_router):
    r, _, _ = pd_router
    out = client.responses.create(model=MODEL, input="x", max_output_tokens=1, store=False)
    assert httpx.get(r.url + f"/v1/responses/{out.id}", timeout=20).status_code == 404
    assert r.app.state.responses_store.bytes == 0


def test_an_unknown_previous_response_id_is_openais_404(pd_router):
    r, _, d = pd_router
    resp = post(r, {"input": "x", "previous_response_id": "resp_nope", "stream": True})
    assert resp.status_code == 404 and not d.behavior.calls
    assert resp.json() == {"error": {"message": "response 'resp_nope' not found", "type": "invalid_request_error",
                                     "param": "previous_response_id", "code": "previous_response_not_found"}}
    with pytest.raises(openai.NotFoundError):
        openai.OpenAI(base_url=r.url + "/v1", api_key="u", max_retries=0).responses.retrieve("resp_nope")


def test_every_turn_of_a_chain_goes_to_the_prefill_worker_of_its_first(standins, make_router):
    """round_robin alternates the prefill workers; a chain's first response id is its session key."""
    p1, p2, d = standins("prefill"), standins("prefill"), standins("decode")
    r = make_router([p1.address, p2.address], [d.address], policy="round_robin")

    def prefill_of(body: dict) -> tuple[str, str]:
        out = post(r, {"max_output_tokens": 1, **body}).json()
        return out["id"], d.behavior.calls[-1].prefill_address

    plain = {prefill_of({"input": f"plain {i}"})[1] for i in range(2)}
    assert plain == {p1.address, p2.address}
    rid, first = prefill_of({"input": "turn 1"})
    for turn in range(2, 5):
        prefill_of({"input": "unrelated"})  # moves round_robin on
        rid, p = prefill_of({"input": f"turn {turn}", "previous_response_id": rid})
        assert p == first, turn
    _, keyed = prefill_of({"input": "x", "prompt_cache_key": "mine"})  # the client's own key wins
    assert prefill_of({"input": "y", "prompt_cache_key": "mine"})[1] == keyed


def test_a_stream_broken_after_its_first_token_ends_with_response_failed(pd_router):
    r, _, d = pd_router
    d.behavior.fail_after_tokens = 2
    with httpx.stream("POST", r.url + "/v1/responses", json={"input": "x", "max_output_tokens": 8, "stream": True},
                      timeout=20) as resp:
        events = events_of(resp)
    last = EVENT.validate_python(events[-1])
    assert last.type == "response.failed" and last.response.status == "failed"
    assert last.response.error.code == "server_error" and last.response.output[0].status == "incomplete"
    assert events[-2]["type"] == "response.output_item.done"
    assert httpx.get(r.url + f"/v1/responses/{last.response.id}", timeout=20).status_code == 404


@pytest.mark.parametrize("body, param, words", [
    ({"input": "x", "max_output_tokens": 5000}, "max_output_tokens", "max_output_tokens=5000 plus the prompt"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", "must be in [1,"),
    ({"input": "x", "tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function", "name": "g"}},
     "tool_choice.name", "no tool named 'g'"),
    ({"input": "x", "tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"input": "x", "truncation": "auto"}, "truncation", "never cut"),
    ({"input": "x", "reasoning": {"effort": "low"}}, "reasoning.effort", "chat_template_kwargs"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "s"}}}, "text.format.schema", "required"),
    ({"input": "x", "temperature": "hot"}, "temperature", "number"),
    ({"input": [{"type": "computer_call", "id": "c"}]}, "input.0.type", "not served"),
    ({"input": "x", "chat_template_kwargs": {"tools": []}}, "chat_template_kwargs", "may not set"),
    ({}, "input", "Field required"),
])
def test_bad_input_is_a_400_naming_the_responses_field(pd_router, body, param, words):
    r, _, d = pd_router
    resp = post(r, body)
    err = resp.json()["error"]
    assert resp.status_code == 400 and err["param"] == param and words in err["message"], err
    assert not d.behavior.calls


def test_a_wrong_model_is_a_404_and_the_api_key_is_checked(standins, make_router):
    p, d = standins("prefill"), standins("decode")
    r = make_router([p.address], [d.address], api_key="k")
    assert post(r, {"input": "x"}).status_code == 401
    assert httpx.get(r.url + "/v1/responses/resp_x", timeout=20).status_code == 401
    assert httpx.delete(r.url + "/v1/responses/resp_x", timeout=20).status_code == 401
    wrong = post(r, {"input": "x", "model": "gpt-4o"}, headers={"authorization": "Bearer k"})
    assert wrong.status_code == 404 and wrong.json()["error"]["param"] == "model"


def test_the_route_is_served_by_the_hot_path_counted_and_documented(pd_router):
    r, _, _ = pd_router
    assert r.app.hot_routes.handlers[b"/v1/responses"].__name__ == "create"  # answered without ASGI
    assert post(r, {"input": "x", "max_output_tokens": 1}).status_code == 200
    metrics = httpx.get(r.url + "/metrics", timeout=20).text
    assert 'pdorch_router_requests_total{route="/v1/responses",status="200"} 1.0' in metrics
    assert 'pdorch_router_ttft_seconds_count{route="/v1/responses"} 1.0' in metrics
    spec = httpx.get(r.url + "/openapi.json", timeout=20).json()
    body = spec["paths"]["/v1/responses"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {"input", "previous_response_id", "store", "tools", "text"} <= set(body["properties"])
    assert {"get", "delete"} <= set(spec["paths"]["/v1/responses/{response_id}"])
