"""Tool calls and reasoning as agent frameworks meet them (issue 51), on the real stack: the official
`openai` client -> the real router -> D -> P (tiny random-weights Llama with SmolLM2's tool-blind
template: its tool turns go through the built-in ChatML template, whose call format is hermes'). Forced calls over nested pydantic models ($defs) come back as calls whose
arguments fit; streamed tool chats carry their logprobs; a template that opens <think> gets its
thinking in reasoning_content and its grammar only after </think>, across P and D.

Random weights cannot be smart: the checks are that what was asked for was parsed, not that it is true.
"""

from __future__ import annotations

import json
import re
import shutil

import openai
import pytest

from engine.tokenizer import Tokenizer
from pdorch.local_stack.router import cluster_router
from pdorch.local_stack.workers import WorkerCluster, make_config
from store_client.master import MasterProcess

MESSAGES = [{"role": "user", "content": "Save Ann, who lives in Oslo."}]
# as pydantic's model_json_schema() writes nested models (each in $defs), values bounded for a random model
ADDRESS = {"properties": {"city": {"enum": ["Oslo", "Rome"], "title": "City", "type": "string"},
                          "zip": {"enum": ["0150", "00184"], "title": "Zip", "type": "string"}},
           "required": ["city", "zip"], "title": "Address", "type": "object"}
PERSON = {"$defs": {"Address": ADDRESS},
          "properties": {"name": {"enum": ["Ann", "Bo"], "title": "Name", "type": "string"},
                         "home": {"$ref": "#/$defs/Address"},
                         "past": {"items": {"$ref": "#/$defs/Address"}, "maxItems": 2, "title": "Past",
                                  "type": "array"}},
          "required": ["name", "home", "past"], "title": "Person", "type": "object"}
SAVE = {"type": "function", "function": {"name": "save_person", "description": "Store a person",
                                         "parameters": PERSON}}
LEVEL = {"type": "function", "function": {"name": "set_level", "parameters": {
    "type": "object", "properties": {"level": {"enum": [1, 2, 3]}}, "required": ["level"]}}}


def address_fits(a) -> bool:
    return isinstance(a, dict) and set(a) == {"city", "zip"} and a["city"] in ("Oslo", "Rome") and \
        a["zip"] in ("0150", "00184")


def fits(name: str, args: dict) -> bool:
    """The arguments validate against the tool's schema (written out: no validator dependency)."""
    if name == "set_level":
        return args.keys() == {"level"} and args["level"] in (1, 2, 3)
    return (name == "save_person" and set(args) == {"name", "home", "past"} and args["name"] in ("Ann", "Bo")
            and address_fits(args["home"]) and isinstance(args["past"], list) and len(args["past"]) <= 2
            and all(address_fits(a) for a in args["past"]))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, tiny_model_dir):
    tmp = tmp_path_factory.mktemp("agent_tools")
    master = MasterProcess(log_dir=str(tmp)).start()
    # every prompt goes to P (no local prefill on D): P samples the first token under the grammar, D the rest
    c = WorkerCluster(make_config(tmp, tiny_model_dir, master, decode={"max_local_prefill_tokens": 0}), tmp, master)
    with c.stopped_on_failure():
        c.wait_ready(c.spawn_worker("prefill"), c.spawn_worker("decode"))
    yield c
    c.stop()


@pytest.fixture(scope="module")
def client(cluster, tiny_model_dir):
    r = cluster_router(cluster, tiny_model_dir)
    yield openai.OpenAI(base_url=r.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    r.stop()


def streamed_calls(chunks) -> list[tuple[str, str]]:
    """(name, arguments) of each call, put together from its deltas as a client does."""
    calls: dict[int, list[str]] = {}
    for c in chunks:
        for d in c.choices[0].delta.tool_calls or []:
            if d.id:
                assert d.index == len(calls) and d.type == "function" and d.function.name
                calls[d.index] = [d.function.name, d.function.arguments or ""]
            else:
                assert d.function.name is None
                calls[d.index][1] += d.function.arguments or ""
    return [tuple(c) for c in calls.values()]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "save_person"}}])
def test_a_forced_call_over_nested_pydantic_models_returns_arguments_that_fit(client, choice):
    """Issue 51's first-request failure: a tool whose parameters hold $defs, tool_choice required or
    named; the call comes back parsed, streamed or not."""
    kwargs = {"model": None, "messages": MESSAGES, "tools": [SAVE, LEVEL], "tool_choice": choice,
              "parallel_tool_calls": False, "max_tokens": 150, "temperature": 0}
    out = client.chat.completions.create(**kwargs)
    msg, finish = out.choices[0].message, out.choices[0].finish_reason
    assert finish == "tool_calls" and msg.content is None, out
    (call,) = msg.tool_calls
    assert fits(call.function.name, json.loads(call.function.arguments)), call
    assert choice == "required" or call.function.name == "save_person"
    chunks = [c for c in client.chat.completions.create(**kwargs, stream=True) if c.choices]
    assert streamed_calls(chunks) == [(call.function.name, call.function.arguments)]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_streamed_tool_chats_carry_every_tokens_logprobs(client):
    """Forced (a call) and auto (text): each token's logprobs arrive in the stream, in order, as the
    whole answer gives them."""
    for choice, max_tokens in (({"type": "function", "function": {"name": "set_level"}}, 40), ("auto", 12)):
        kwargs = {"model": None, "messages": MESSAGES, "tools": [SAVE, LEVEL], "tool_choice": choice,
                  "max_tokens": max_tokens, "temperature": 0, "logprobs": True, "top_logprobs": 2}
        whole = client.chat.completions.create(**kwargs).choices[0].logprobs.content
        chunks = [c for c in client.chat.completions.create(**kwargs, stream=True) if c.choices]
        assert any(c.choices[0].logprobs is not None for c in chunks)
        streamed = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.content]
        assert [(t.token, round(t.logprob, 4)) for t in streamed] == [(t.token, round(t.logprob, 4)) for t in whole]
        assert len(whole) > 1 and all(1 <= len(t.top_logprobs) <= 2 for t in streamed)  # a forced token: one


def test_a_tool_definition_named_twice_differently_is_a_400_naming_both(cluster, tiny_model_dir):
    """Forced calls as one bare-JSON schema (a model with no call format) hoist the tools' $defs; a
    name two tools define differently cannot be, and tool_choice auto needs a parser (vLLM)."""
    r = cluster_router(cluster, tiny_model_dir, {"tool_call_parser": "none"})
    try:
        c = openai.OpenAI(base_url=r.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        other = {**PERSON, "$defs": {"Address": {"type": "object", "properties": {"street": {"type": "string"}}}}}
        tools = [SAVE, {"type": "function", "function": {"name": "move_person", "parameters": other}}]
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model=None, messages=MESSAGES, tools=tools, tool_choice="required", max_tokens=8)
        err = e.value.body
        assert err["param"] == "tools" and "'save_person' and 'move_person'" in err["message"], err
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model=None, messages=MESSAGES, tools=[SAVE], max_tokens=8)
        assert e.value.body["param"] == "tool_choice" and "tool call parser" in e.value.body["message"]
        out = c.chat.completions.create(model=None, messages=MESSAGES, tools=[SAVE, LEVEL], tool_choice="required",
                                        parallel_tool_calls=False, max_tokens=150, temperature=0)
        (call,) = out.choices[0].message.tool_calls  # the hoisted schema compiles and constrains
        assert fits(call.function.name, json.loads(call.function.arguments))
    finally:
        r.stop()


@pytest.fixture(scope="module")
def thinking(cluster, tiny_model_dir, tmp_path_factory):
    """A router over the same workers whose chat template opens <think> itself (as the Qwen3 2507
    "Thinking" releases do), with the qwen3 reasoning parser."""
    d = tmp_path_factory.mktemp("thinking_template")
    for f in tiny_model_dir.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, d)
    tcfg = json.loads((d / "tokenizer_config.json").read_text())
    tcfg["chat_template"] += "{% if add_generation_prompt %}<think>\n{% endif %}"
    (d / "tokenizer_config.json").write_text(json.dumps(tcfg))
    r = cluster_router(cluster, d, {"reasoning_parser": "qwen3"})  # the router reads its template from d
    yield openai.OpenAI(base_url=r.url + "/v1", api_key="unused", max_retries=0, timeout=120), d
    r.stop()


def test_a_template_opened_think_block_is_reasoning_and_the_grammar_starts_after_it(thinking, client):
    """The output starts inside the thinking. A +100 bias on the pieces of "</think>" makes the model
    think in those pieces until they spell "</think>"; the JSON schema applies only from there: P's
    first token is a piece the schema alone would refuse, D's tokens follow the schema."""
    c, model_dir = thinking
    tok = Tokenizer.from_dir(model_dir)
    pieces = tok.encode("</think>", add_special_tokens=False)
    fmt = {"type": "json_schema", "json_schema": {"name": "level", "schema": LEVEL["function"]["parameters"]}}
    kwargs = {"model": None, "messages": MESSAGES, "max_tokens": 200, "temperature": 1.0, "seed": 3,
              "response_format": fmt, "logit_bias": {str(i): 100 for i in pieces}}
    out = c.chat.completions.create(**kwargs)
    msg = out.choices[0].message
    assert out.choices[0].finish_reason == "stop", out
    assert re.fullmatch(r"(</|think|>)+", msg.model_extra["reasoning_content"]), msg
    assert json.loads(msg.content)["level"] in (1, 2, 3) and "</think>" not in msg.content
    chunks = [ch.choices[0].delta for ch in c.chat.completions.create(**kwargs, stream=True) if ch.choices]
    assert "".join(d.content or "" for d in chunks) == msg.content
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in chunks) == \
        msg.model_extra["reasoning_content"]
    plain = client.chat.completions.create(**kwargs).choices[0].message  # no thinking: the schema from the start
    assert json.loads(plain.content)["level"] in (1, 2, 3)
    cut = c.chat.completions.create(model=None, messages=MESSAGES, max_tokens=6, temperature=0)
    assert cut.choices[0].finish_reason == "length" and not cut.choices[0].message.content
    assert cut.choices[0].message.model_extra["reasoning_content"]  # cut inside the thinking: all of it reasoning

