"""`/v1/responses` on the real stack: the official `openai` client's `client.responses.create` -> the real
router -> D -> P (tiny random-weights model, real mooncake_master, two prefill workers, decode offload
on). Text and function tools, streamed and not, every streamed event parsed with the SDK's types; a
`previous_response_id` chain whose turns land on one prefill worker (round_robin would alternate them)
and reuse the earlier turns' KV; the 404 of an unknown id.

The tiny model cannot be smart: the checks are that the client got what it asked for (a call of the
named tool whose arguments fit, a JSON answer that fits its schema), not that the answer is true.
"""

from __future__ import annotations

import json
import re

import httpx
import openai
import pytest
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from engine.chat_prompts import ChatPrompts
from engine.tokenizer import Tokenizer
from pdorch.local_stack.router import cluster_router
from pdorch.local_stack.workers import start_cluster

EVENT = TypeAdapter(ResponseStreamEvent)
PAGE = 16
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather of a city", "parameters": {
    "type": "object", "properties": {"unit": {"enum": ["c", "f"]}, "days": {"enum": [1, 2, 3]}},
    "required": ["unit", "days"], "additionalProperties": False}}
REPORT = {"type": "object", "properties": {"ok": {"type": "boolean"}, "level": {"enum": ["low", "high"]}},
          "required": ["ok", "level"], "additionalProperties": False}
QUESTION = "What is the weather in Oslo this week, and should I take a coat or an umbrella with me?"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, tiny_model_dir):
    c = start_cluster(tmp_path_factory.mktemp("responses_api"), tiny_model_dir, num_prefill=2,
                      decode={"offload_generated_kv": True})
    yield c
    c.stop()


@pytest.fixture(scope="module")
def router(cluster, tiny_model_dir):
    r = cluster_router(cluster, tiny_model_dir, policy="round_robin")
    yield r
    r.stop()


@pytest.fixture(scope="module")
def client(router):
    return openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def streamed(router, body: dict) -> list:
    """The events of a streamed response, each parsed with the SDK's ResponseStreamEvent."""
    with httpx.stream("POST", router.url + "/v1/responses", json={**body, "stream": True}, timeout=120) as resp:
        assert resp.status_code == 200, resp.read()
        events = [EVENT.validate_python(json.loads(line[6:])) for line in resp.iter_lines()
                  if line.startswith("data: ")]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    return events


def prefill_counts(router) -> dict[str, float]:
    text = httpx.get(router.url + "/metrics", timeout=30).text
    pattern = r'^pdorch_router_worker_requests_total\{role="prefill",worker="([^"]+)"\} (\S+)$'
    return {m[1]: float(m[2]) for m in re.finditer(pattern, text, re.MULTILINE)}


def routed_prefill(router, before: dict[str, float]) -> str:
    after = prefill_counts(router)
    (moved,) = [w for w, n in after.items() if n != before.get(w, 0.0)]
    return moved


def test_text_streamed_and_not_is_the_same_greedy_answer(client, router):
    out = client.responses.create(input=QUESTION, instructions="Answer briefly.", max_output_tokens=12,
                                  temperature=0)
    assert out.status in ("completed", "incomplete") and out.output[0].type == "message"
    events = streamed(router, {"input": QUESTION, "instructions": "Answer briefly.", "max_output_tokens": 12,
                               "temperature": 0})
    assert events[0].type == "response.created" and events[-1].type == f"response.{out.status}"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == out.output_text == events[-1].response.output_text
    assert events[-1].response.usage.output_tokens == out.usage.output_tokens <= 12


def test_a_named_function_tool_is_called_with_arguments_that_fit(client, router):
    kwargs = {"input": QUESTION, "tools": [WEATHER], "tool_choice": {"type": "function", "name": "get_weather"},
              "max_output_tokens": 60, "temperature": 0}
    out = client.responses.create(**kwargs)
    (call,) = out.output
    args = json.loads(call.arguments)
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    assert args["unit"] in ("c", "f") and args["days"] in (1, 2, 3) and out.status == "completed"
    events = streamed(router, kwargs)
    pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert "".join(pieces) == done.arguments == call.arguments
    assert events[-1].type == "response.completed" and events[-1].response.output[0].name == "get_weather"


def test_text_format_json_schema_answers_json_that_fits(client):
    out = client.responses.create(input=QUESTION, max_output_tokens=60, temperature=1.0,
                                  text={"format": {"type": "json_schema", "name": "report", "schema": REPORT,
                                                   "strict": True}})
    value = json.loads(out.output_text)
    assert set(value) == {"ok", "level"} and isinstance(value["ok"], bool) and value["level"] in ("low", "high")


def test_a_tool_loop_chain_lands_on_one_prefill_worker_and_reuses_its_kv(client, router, tiny_model_dir):
    """Turn 1 calls the tool; turn 2 sends the tool's result with previous_response_id (the Agents SDK's
    loop); turn 3 asks more. Every turn goes to turn 1's prefill worker, and turns 2 and 3 find the
    earlier turns' pages cached."""
    before = prefill_counts(router)
    one = client.responses.create(input=QUESTION, tools=[WEATHER], max_output_tokens=60, temperature=0,
                                  tool_choice={"type": "function", "name": "get_weather"})
    first = routed_prefill(router, before)
    (call,) = one.output
    plain = prefill_counts(router)
    client.responses.create(input="Unrelated.", max_output_tokens=2)  # moves round_robin to the other worker
    assert routed_prefill(router, plain) != first
    before = prefill_counts(router)
    two = client.responses.create(input=[{"type": "function_call_output", "call_id": call.call_id,
                                          "output": "minus three degrees and snow"}],
                                  previous_response_id=one.id, tools=[WEATHER], max_output_tokens=8, temperature=0)
    assert routed_prefill(router, before) == first
    # the prompt: turn 1's question, its call, the tool's result, as a chat client would have sent them
    # (the tiny model's template ignores tools: its tool turns go through the built-in one, as the router does)
    expected = ChatPrompts.load(Tokenizer.from_dir(tiny_model_dir)).encode(
        [{"role": "user", "content": QUESTION},
         {"role": "assistant", "content": "", "tool_calls": [{"id": call.call_id, "type": "function", "function": {
             "name": "get_weather", "arguments": json.loads(call.arguments)}}]},
         {"role": "tool", "content": "minus three degrees and snow", "tool_call_id": call.call_id}],
        tools=[{"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}])
    assert two.usage.input_tokens == len(expected)
    cached = two.usage.input_tokens_details.cached_tokens
    assert cached >= one.usage.input_tokens // PAGE * PAGE > 0, (cached, one.usage)
    before = prefill_counts(router)
    three = client.responses.create(input="And tomorrow?", previous_response_id=two.id, tools=[WEATHER],
                                    max_output_tokens=4, temperature=0, stream=True)
    final = [e for e in three if e.type in ("response.completed", "response.incomplete")][-1].response
    assert routed_prefill(router, before) == first and final.previous_response_id == two.id
    assert final.usage.input_tokens_details.cached_tokens >= two.usage.input_tokens // PAGE * PAGE
    assert client.responses.retrieve(two.id).output_text == two.output_text


def test_an_unknown_previous_response_id_is_a_404_in_openais_shape(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(input="x", previous_response_id="resp_0000", max_output_tokens=2)
    assert e.value.body == {"message": "response 'resp_0000' not found", "type": "invalid_request_error",
                            "param": "previous_response_id", "code": "previous_response_not_found"}
