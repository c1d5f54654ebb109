"""router/http/structured.py, router/http/tools.py and the refused fields of router/http/bodies.py: pure logic."""

from __future__ import annotations

import json

import pytest

from router.errors import APIError
from router.http.bodies import ChatCompletionRequest, CompletionRequest, GenerateRequest
from router.http.body_sampling import REFUSED, refuse_unserved
from router.http.json_calls import ToolStream, final_message, json_calls
from router.http.structured import grammar_of
from router.http.tools import ToolPlan, template_messages, tool_plan

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": SCHEMA}}
TIME = {"type": "function", "function": {"name": "time", "description": "now"}}


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate_json(json.dumps({"messages": [{"role": "user", "content": "hi"}],
                                                                 **fields}))


def refused(fn, *args) -> APIError:
    with pytest.raises(APIError) as e:
        fn(*args)
    assert e.value.status == 400
    return e.value


@pytest.mark.parametrize("fields, param, kind, spec", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}},
     "response_format.json_schema.schema", "json_schema", SCHEMA),
    ({"response_format": {"type": "json_object"}}, "response_format", "json_object", ""),
    ({"response_format": {"type": "text"}}, None, None, None),
    ({"structured_outputs": {"json": SCHEMA}}, "structured_outputs.json", "json_schema", SCHEMA),
    ({"structured_outputs": {"regex": "a+"}}, "structured_outputs.regex", "regex", "a+"),
    ({"structured_outputs": {"choice": ["yes", "no?"]}}, "structured_outputs.choice", "regex", r"(yes|no\?)"),
    ({"structured_outputs": {"grammar": 'root ::= "a"'}}, "structured_outputs.grammar", "ebnf", 'root ::= "a"'),
    ({"guided_json": json.dumps(SCHEMA)}, "guided_json", "json_schema", SCHEMA),
    ({"guided_choice": ["a", "b"]}, "guided_choice", "regex", "(a|b)"),
    ({"regex": r"\d+"}, "regex", "regex", r"\d+"),
    ({"ebnf": 'root ::= "b"'}, "ebnf", "ebnf", 'root ::= "b"'),
    ({"json_schema": SCHEMA}, "json_schema", "json_schema", SCHEMA),
])
def test_every_spelling_of_a_structured_output_becomes_one_grammar(fields, param, kind, spec):
    got = grammar_of(chat(**fields))
    if param is None:
        assert got is None
        return
    grammar, where = got
    assert (where, grammar.kind) == (param, kind)
    assert (json.loads(grammar.spec) if kind == "json_schema" else grammar.spec) == spec


def test_sglang_sampling_params_grammar_names_its_place():
    req = GenerateRequest.model_validate_json(json.dumps({"text": "x", "sampling_params": {"regex": "[ab]+"}}))
    grammar, where = grammar_of(req.sampling_params, "sampling_params.")
    assert (grammar.kind, grammar.spec, where) == ("regex", "[ab]+", "sampling_params.regex")


@pytest.mark.parametrize("fields, param, words", [
    ({"response_format": {"type": "json_object"}, "regex": "a"}, "regex", "at most one structured output"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema", "is required"),
    ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
    ({"json_schema": "[1]"}, "json_schema", "must be a JSON schema"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", "exactly one"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice", "at least one choice"),
    ({"regex": ""}, "regex", "is empty"),
])
def test_a_structured_output_the_router_can_judge_is_refused_naming_the_field(fields, param, words):
    err = refused(grammar_of, chat(**fields))
    assert err.param == param and words in err.message


def test_named_tool_choice_without_a_call_format_constrains_to_the_functions_parameters():
    plan = tool_plan(chat(tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "weather"}}))
    assert (plan.mode, plan.forced_name, json.loads(plan.grammar.spec)) == ("named", "weather", SCHEMA)
    assert [t["function"]["name"] for t in plan.template_tools] == ["weather", "time"]
    (call,) = json_calls(plan, '{"city": "Paris"}')
    assert (call.name, json.loads(call.arguments)) == ("weather", {"city": "Paris"}) and call.id.startswith("call_")
    assert json_calls(plan, '{"city": "Par') is None  # cut short: no call


def test_required_tool_choice_without_a_call_format_is_an_array_of_calls_of_the_listed_tools():
    plan = tool_plan(chat(tools=[WEATHER, TIME], tool_choice="required"))
    schema = json.loads(plan.grammar.spec)
    assert schema["type"] == "array" and schema["minItems"] == 1 and "maxItems" not in schema
    names = [c["properties"]["name"]["enum"] for c in schema["items"]["anyOf"]]
    assert names == [["weather"], ["time"]]
    assert schema["items"]["anyOf"][0]["properties"]["parameters"] == SCHEMA
    calls = json_calls(plan, '[{"name": "time", "parameters": {}}, {"name": "weather", "parameters": {"city": "Oslo"}}]')
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("time", {}), ("weather", {"city": "Oslo"})]
    one = tool_plan(chat(tools=[WEATHER], tool_choice="required", parallel_tool_calls=False))
    assert json.loads(one.grammar.spec)["maxItems"] == 1


# pydantic's JSON schemas of nested models, as model_json_schema() writes them: each nested model in
# $defs, referenced from the root ("#/$defs/...")
ADDRESS = {"properties": {"city": {"title": "City", "type": "string"},
                          "zip": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None, "title": "Zip"}},
           "required": ["city"], "title": "Address", "type": "object"}
PERSON = {"$defs": {"Address": ADDRESS},
          "properties": {"name": {"title": "Name", "type": "string"}, "home": {"$ref": "#/$defs/Address"},
                         "past": {"items": {"$ref": "#/$defs/Address"}, "title": "Past", "type": "array"}},
          "required": ["name", "home", "past"], "title": "Person", "type": "object"}
ORDER = {"$defs": {"Address": ADDRESS, "Item": {"properties": {"sku": {"title": "Sku", "type": "string"}},
                                                "required": ["sku"], "title": "Item", "type": "object"}},
         "properties": {"items": {"items": {"$ref": "#/$defs/Item"}, "title": "Items", "type": "array"},
                        "ship_to": {"$ref": "#/$defs/Address"}},
         "required": ["items", "ship_to"], "title": "Order", "type": "object"}


def fn(name: str, parameters: dict) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def test_required_hoists_every_tools_definitions_to_the_root_of_the_combined_schema():
    plan = tool_plan(chat(tools=[fn("save_person", PERSON), fn("place_order", ORDER)], tool_choice="required"))
    schema = json.loads(plan.grammar.spec)
    assert schema["$defs"] == {"Address": ADDRESS, "Item": ORDER["$defs"]["Item"]}
    for call in schema["items"]["anyOf"]:
        assert "$defs" not in call["properties"]["parameters"]
    assert schema["items"]["anyOf"][0]["properties"]["parameters"]["properties"]["home"] == {"$ref": "#/$defs/Address"}
    assert PERSON["$defs"] == {"Address": ADDRESS}  # the request's own schema is not changed


def test_two_tools_defining_one_name_differently_is_a_400_naming_both():
    other = {**ORDER, "$defs": {**ORDER["$defs"], "Address": {"type": "object", "properties": {"street": {}}}}}
    err = refused(tool_plan, chat(tools=[fn("save_person", PERSON), fn("place_order", other)], tool_choice="required"))
    assert err.param == "tools" and "'save_person' and 'place_order'" in err.message and "$defs/Address" in err.message


@pytest.mark.parametrize("fields, param, words", [
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "wether"}}},
     "tool_choice.function.name", "no tool named 'wether' (tools: weather)"),
    ({"tools": [WEATHER, WEATHER]}, "tools", "distinct"),
])
def test_a_tool_choice_that_cannot_be_served_is_refused(fields, param, words):
    err = refused(tool_plan, chat(**fields))
    assert err.param == param and words in err.message


def test_auto_and_none_keep_the_output_free():
    assert tool_plan(chat(tools=[WEATHER]), "hermes").grammar is None
    assert tool_plan(chat(tools=[WEATHER], tool_choice="none")).mode == "none"
    assert tool_plan(chat()) is None and tool_plan(chat(tool_choice="none")) is None


def test_auto_on_a_model_with_no_call_format_is_refused_as_vllm_does_and_none_is_not():
    for choice in ({"tool_choice": "auto"}, {}):
        err = refused(tool_plan, chat(tools=[WEATHER], **choice))
        assert err.param == "tool_choice" and "tool call parser" in err.message
    assert tool_plan(chat(tools=[WEATHER], tool_choice="none")).grammar is None


def structural(plan) -> dict:
    assert plan.grammar.kind == "structural_tag"
    return json.loads(plan.grammar.spec)["format"]


@pytest.mark.parametrize("parser, begin, end", [
    ("hermes", '<tool_call>\n{"name": "weather", "arguments": ', "}\n</tool_call>"),
    ("llama3_json", '{"name": "weather", "parameters": ', "}"),
    ("mistral", '{"name": "weather", "arguments": ', "}"),
])
def test_forced_calls_are_structural_tags_in_the_familys_call_format(parser, begin, end):
    named = structural(tool_plan(chat(tools=[WEATHER, TIME], tool_choice={"type": "function",
                                                                            "function": {"name": "weather"}}), parser))
    tag = named["elements"][1] if parser == "mistral" else named
    assert (tag["begin"], tag["end"], tag["content"]["json_schema"]) == (begin, end, SCHEMA)
    required = structural(tool_plan(chat(tools=[WEATHER, TIME], tool_choice="required"), parser))
    calls = required["elements"][1] if parser == "mistral" else required
    assert calls["type"] == "tags_with_separator" and calls["at_least_one"] and not calls["stop_after_first"]
    assert [t["begin"] for t in calls["tags"]] == [begin, begin.replace("weather", "time")]
    assert calls["tags"][1]["content"]["json_schema"] == {"type": "object", "properties": {}}
    one = structural(tool_plan(chat(tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False), parser))
    assert (one["elements"][1] if parser == "mistral" else one)["stop_after_first"]


def test_strict_tools_in_auto_constrain_their_calls_and_leave_the_text_free():
    strict = {"type": "function", "function": {**WEATHER["function"], "strict": True}}
    plan = tool_plan(chat(tools=[strict, TIME]), "hermes")
    fmt = structural(plan)
    assert fmt["type"] == "triggered_tags" and fmt["triggers"] == ["<tool_call>"] and not fmt.get("at_least_one")
    assert [t["content"]["json_schema"] for t in fmt["tags"]] == [SCHEMA, {"type": "object"}]  # TIME: not strict


def allowed(mode: str, *names: str) -> dict:
    return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": [
        {"type": "function", "function": {"name": n}} for n in names]}}


@pytest.mark.parametrize("parser", ["hermes", "none"])
def test_allowed_tools_required_forces_a_call_of_the_listed_tools_with_every_tool_in_the_prompt(parser):
    """OpenAI's allowed_tools (pydantic-ai sends it for a tool_choice of several names): the prompt
    keeps every tool, the grammar holds the listed ones only."""
    plan = tool_plan(chat(tools=[WEATHER, TIME], tool_choice=allowed("required", "time")), parser)
    assert plan.mode == "required" and plan.names == ("time",) and plan.forced
    assert [t["function"]["name"] for t in plan.template_tools] == ["weather", "time"]
    if parser == "hermes":
        calls = structural(plan)
        assert [t["begin"] for t in calls["tags"]] == ['<tool_call>\n{"name": "time", "arguments": ']
    else:
        assert json.loads(plan.grammar.spec)["items"]["properties"]["name"]["enum"] == ["time"]


def test_allowed_tools_auto_leaves_text_free_and_a_begun_call_one_of_the_listed_tools():
    plan = tool_plan(chat(tools=[WEATHER, TIME], tool_choice=allowed("auto", "weather")), "hermes")
    assert plan.mode == "auto" and plan.names == ("weather",) and not plan.forced
    fmt = structural(plan)
    assert fmt["type"] == "triggered_tags" and fmt["triggers"] == ["<tool_call>"]
    assert [t["begin"] for t in fmt["tags"]] == ['<tool_call>\n{"name": "weather", "arguments": ']
    every = tool_plan(chat(tools=[WEATHER, TIME], tool_choice=allowed("auto", "time", "weather")), "hermes")
    assert every.grammar is None and every.names == ("weather", "time")  # all allowed: plain "auto"


@pytest.mark.parametrize("choice, param, words", [
    (allowed("required", "wether"), "tool_choice.allowed_tools.tools.0.function.name", "no tool named 'wether'"),
    (allowed("any", "weather"), "tool_choice", ""),
    (allowed("auto"), "tool_choice", ""),
])
def test_allowed_tools_that_cannot_be_served_are_refused_naming_the_field(choice, param, words):
    from router.http.bodies import parse

    with pytest.raises(APIError) as e:
        tool_plan(parse(ChatCompletionRequest, json.dumps({"messages": [{"role": "user", "content": "hi"}],
                                                           "tools": [WEATHER], "tool_choice": choice}).encode()))
    assert e.value.status == 400 and e.value.param.startswith(param) and words in e.value.message, e.value


def test_the_named_call_streams_its_arguments_and_ends_with_tool_calls():
    plan = tool_plan(chat(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "weather"}}))
    stream = ToolStream(plan)
    first = stream.delta('{"city"')
    (call,) = first["tool_calls"]
    assert (call["index"], call["type"], call["function"]) == (0, "function", {"name": "weather", "arguments": '{"city"'})
    assert stream.delta('{"city": "Ro') == {"tool_calls": [{"index": 0, "function": {"arguments": ': "Ro'}}]}
    last, finish = stream.finish('{"city": "Rome"}', "stop")
    assert finish == "tool_calls" and last["tool_calls"][0]["function"] == {"arguments": 'me"}'}


def test_required_calls_come_in_one_chunk_at_the_end_and_a_cut_one_as_text():
    plan = tool_plan(chat(tools=[WEATHER], tool_choice="required"))
    stream = ToolStream(plan)
    assert stream.delta("[{") is None and stream.delta('[{"name"') is None
    text = '[{"name": "weather", "parameters": {"city": "Oslo"}}]'
    last, finish = stream.finish(text, "stop")
    assert finish == "tool_calls" and last["tool_calls"][0]["function"]["name"] == "weather"
    cut, finish = ToolStream(plan).finish('[{"name": "wea', "length")
    assert finish == "length" and cut["content"] == '[{"name": "wea'
    message, finish = final_message(plan, text, "stop")
    assert finish == "tool_calls" and message["content"] is None and len(message["tool_calls"]) == 1
    assert final_message(plan, '[{"na', "length") == ({"role": "assistant", "content": '[{"na'}, "length")


def test_tool_turns_reach_the_template_with_arguments_as_objects():
    req = chat(messages=[
        {"role": "user", "content": "weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "-3 C"}])
    msgs = template_messages(req.messages)
    assert msgs[1]["tool_calls"][0]["function"] == {"name": "weather", "arguments": {"city": "Oslo"}}
    assert "reasoning_content" not in msgs[1]
    thought = chat(messages=[{"role": "assistant", "content": "", "reasoning_content": "Oslo: call weather."}])
    assert template_messages(thought.messages)[0]["reasoning_content"] == "Oslo: call weather."  # Qwen3 replays it
    assert msgs[2] == {"role": "tool", "content": "-3 C", "tool_call_id": "call_1"}
    bad = chat(messages=[{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}])
    assert refused(template_messages, bad.messages).param == "messages.0.tool_calls.0.function.arguments"


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_every_refused_field_is_refused_by_name_and_its_default_is_not(name):
    served, _ = REFUSED[name]
    model = CompletionRequest if name in ("best_of", "suffix") else ChatCompletionRequest
    base = {"prompt": "x"} if model is CompletionRequest else {"messages": [{"role": "user", "content": "x"}]}
    for value in served:
        refuse_unserved(model.model_validate_json(json.dumps({**base, name: value})))
    other = {"best_of": 3,
             "suffix": "end", "modalities": ["text", "audio"],
             "service_tier": "flex", "store": True, "metadata": {"a": "b"}}.get(name, {"anything": 1})
    err = refused(refuse_unserved, model.model_validate_json(json.dumps({**base, name: other})))
    assert err.param == name and name in err.message


def test_plan_for_required_with_a_tool_without_parameters_takes_an_empty_object():
    plan = tool_plan(chat(tools=[TIME], tool_choice="required"))
    assert isinstance(plan, ToolPlan)
    item = json.loads(plan.grammar.spec)["items"]
    assert item["properties"]["parameters"] == {"type": "object", "properties": {}}


def test_the_models_generation_config_fills_what_a_request_leaves_unset(tmp_path):
    from router.http.bodies import SGLangSampling
    from router.http.body_sampling import sampling_from_openai, sampling_from_sglang, with_defaults
    from router.http.service import sampling_defaults

    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "repetition_penalty": 1.05, "do_sample": True,
         "eos_token_id": 2, "min_p": True}))  # a bool is no number: ignored
    defaults = sampling_defaults("auto", tmp_path)
    assert defaults == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "repetition_penalty": 1.05}
    assert sampling_defaults("none", tmp_path) == {} and sampling_defaults("auto", tmp_path / "nowhere") == {}
    sp, _ = sampling_from_openai(with_defaults(chat(temperature=0.0, top_p=None), defaults))
    assert (round(sp.temperature, 3), round(sp.top_p, 3), sp.top_k, round(sp.repetition_penalty, 3)) == \
        (0.0, 0.95, 20, 1.05)  # the request's own temperature 0 stays; its null top_p takes the model's
    sg, _ = sampling_from_sglang(with_defaults(SGLangSampling.model_validate({"top_k": 5}), defaults))
    assert (round(sg.temperature, 3), sg.top_k) == (0.6, 5)


def test_one_grammar_per_request_from_tools_structured_outputs_and_thinking():
    from router.http.generation import constraint
    from router.http.reasoning import INSIDE

    rf = {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}}
    req = chat(tools=[WEATHER], **rf)
    grammar, param = constraint(req, tool_plan(req, "hermes"))
    either = json.loads(grammar.spec)["format"]
    assert param == "response_format.json_schema.schema" and either["type"] == "or"
    assert either["elements"][0]["json_schema"] == SCHEMA and either["elements"][1]["type"] == "tags_with_separator"
    req = chat(tools=[WEATHER], regex="a+")  # any other structured output: the whole output, as vLLM
    assert (constraint(req, tool_plan(req, "hermes"))[0].kind, constraint(req, tool_plan(req, "hermes"))[1]) == \
        ("regex", "regex")
    strict = {"type": "function", "function": {**WEATHER["function"], "strict": True}}
    req = chat(tools=[strict], regex="a+")
    assert refused(constraint, req, tool_plan(req, "hermes")).param == "regex"
    # a forced call with response_format (the Agents SDK's output_type + tool_choice "required"): the call
    # is the turn, the format shapes text answers (OpenAI; vLLM's tool schema takes over too)
    req = chat(tools=[WEATHER], tool_choice="required", **rf)
    grammar, param = constraint(req, tool_plan(req, "hermes"))
    assert param == "tool_choice" and grammar.spec == tool_plan(req, "hermes").grammar.spec
    req = chat(tools=[WEATHER], tool_choice="required", regex="a+")  # what a regex asks for cannot be a call
    assert refused(constraint, req, tool_plan(req, "hermes")).param == "regex"
    req = chat(tools=[WEATHER], tool_choice="required")
    grammar, param = constraint(req, tool_plan(req, "hermes"), INSIDE)
    think, calls = json.loads(grammar.spec)["format"]["elements"]
    assert param == "tool_choice" and think["begin"] == "" and think["end"][-1] == "</think>"
    assert calls == json.loads(tool_plan(req, "hermes").grammar.spec)["format"]
