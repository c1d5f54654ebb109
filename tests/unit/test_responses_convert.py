"""router/http/responses_request.py and responses_convert.py: a Responses body as the chat request the
chat pipeline serves, every field honoured or refused by name (pure logic)."""

from __future__ import annotations

import json

import pytest

from router.errors import APIError, bad_request
from router.http.bodies import ChatCompletionRequest, parse
from router.http.responses_convert import (
    chat_body,
    check_served,
    conversation,
    input_messages,
    responses_param,
)
from router.http.responses_request import RESPONSES_REFUSED, ResponsesRequest
from router.http.tools import template_messages, tool_plan

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"type": "function", "name": "weather", "description": "Weather of a city", "parameters": SCHEMA,
           "strict": True}


def req(**fields) -> ResponsesRequest:
    return parse(ResponsesRequest, json.dumps({"input": "hi", **fields}).encode())


def refused(fn, *args) -> APIError:
    with pytest.raises(APIError) as e:
        fn(*args)
    assert e.value.status == 400 and "Traceback" not in e.value.message
    return e.value


def chat_of(r: ResponsesRequest, history: list[dict] | None = None) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(chat_body(r, conversation(r, history or [], input_messages(r)), "s"))


def test_a_string_input_with_instructions_is_a_system_and_a_user_message():
    r = req(input="What is the weather?", instructions="Be brief.", max_output_tokens=7, temperature=0.5, top_p=0.9)
    chat = chat_of(r)
    assert template_messages(chat.messages) == [{"role": "system", "content": "Be brief."},
                                                {"role": "user", "content": "What is the weather?"}]
    assert (chat.max_completion_tokens, chat.temperature, chat.top_p) == (7, 0.5, 0.9)
    assert chat.prompt_cache_key == "s" and chat.stream is False


def test_items_become_the_chat_turns_an_agent_loop_had():
    """reasoning + message + function_call of one answer are one assistant turn; the call's result a tool turn."""
    items = [
        {"role": "developer", "content": "Use tools."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in "},
                                                        {"type": "input_text", "text": "Oslo?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Ask it."}]},
        {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "weather", "arguments": '{"city": "Oslo"}'},
        {"type": "function_call", "call_id": "call_2", "name": "weather", "arguments": '{"city": "Bergen"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "-3 C"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "rain"}]},
        {"type": "message", "role": "assistant", "content": "Cold in Oslo, rain in Bergen."},
    ]
    got = input_messages(req(input=items))
    assert got == [
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "Ask it.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Bergen"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "-3 C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "rain"},
        {"role": "assistant", "content": "Cold in Oslo, rain in Bergen."},
    ]
    # the template sees what it sees from the chat endpoint: arguments as objects, the tool turns' ids
    msgs = template_messages(ChatCompletionRequest.model_validate({"messages": got}).messages)
    assert msgs[2]["tool_calls"][1]["function"] == {"name": "weather", "arguments": {"city": "Bergen"}}
    assert msgs[4] == {"role": "tool", "content": "rain", "tool_call_id": "call_2"}


def test_text_after_a_call_and_a_second_answer_are_turns_of_their_own():
    items = [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
             {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert [m["content"] for m in input_messages(req(input=items))] == [None, "a", "b"]


@pytest.mark.parametrize("item, param, words", [
    ({"type": "web_search_call", "id": "x"}, "input.0.type", "'web_search_call' items are not served"),
    ({"type": "item_reference", "id": "msg_1"}, "input.0.type", "not served"),
    ({"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}, "input.0.content.0",
     "'input_image' content is not served"),
    ({"type": "function_call", "call_id": "c", "name": "f", "arguments": "{oops"}, "input.0.arguments",
     "not valid JSON"),
    ({"type": "function_call", "name": "f", "arguments": "{}"}, "input.0.call_id", "Field required"),
    ({"type": "function_call_output", "call_id": "c", "output": 3}, "input.0.output", "expected"),
    ({"role": "tool", "content": "x"}, "input.0.role", "Input should be"),
    ({"type": "reasoning", "summary": [], "encrypted_content": "gAAA"}, "input.0.encrypted_content", "not served"),
    ("just text", "input.0", "Input should be an object"),
])
def test_a_bad_item_is_a_400_naming_it(item, param, words):
    err = refused(lambda: input_messages(req(input=[item])))
    assert err.param == param and words in err.message, err.message


def test_function_tools_and_tool_choice_take_the_chat_shape_and_plan():
    r = req(tools=[WEATHER, {"type": "function", "name": "now"}], tool_choice={"type": "function", "name": "weather"},
            parallel_tool_calls=False)
    chat = chat_of(r)
    assert chat.tools[0].model_dump(exclude_none=True) == {"type": "function", "function": {
        "name": "weather", "description": "Weather of a city", "parameters": SCHEMA, "strict": True}}
    assert chat.parallel_tool_calls is False
    plan = tool_plan(chat, "none")  # no call format: the bare JSON grammar (a family's: tests/unit/test_tool_grammar.py)
    assert plan.mode == "named" and plan.forced_name == "weather" and json.loads(plan.grammar.spec) == SCHEMA
    assert tool_plan(chat_of(req(tools=[WEATHER], tool_choice="required")), "none").mode == "required"
    assert tool_plan(chat_of(req(tools=[WEATHER])), "hermes").mode == "auto"
    unknown = refused(tool_plan, chat_of(req(tools=[WEATHER], tool_choice={"type": "function", "name": "nope"})),
                      "hermes")
    assert responses_param(unknown).param == "tool_choice.name" and "tool_choice.name: no tool" in unknown.message


@pytest.mark.parametrize("tool, param", [
    ({"type": "web_search"}, "tools.0.type"),
    ({"type": "function", "name": "f", "defer_loading": True}, "tools.0.defer_loading"),
    ({"type": "function", "name": ""}, "tools.0.name"),
    ({"type": "function", "function": {"name": "f"}}, "tools.0.name"),  # the chat shape is not the Responses one
])
def test_a_tool_that_is_not_a_responses_function_tool_is_refused(tool, param):
    err = refused(parse, ResponsesRequest, json.dumps({"input": "x", "tools": [tool]}).encode())
    assert err.param.startswith(param), err.param


def test_text_format_becomes_response_format():
    fmt = {"type": "json_schema", "name": "city", "schema": SCHEMA, "strict": True}
    chat = chat_of(req(text={"format": fmt}))
    assert chat.response_format.type == "json_schema" and chat.response_format.json_schema.schema_ == SCHEMA
    assert chat.response_format.json_schema.name == "city" and chat.response_format.json_schema.strict is True
    assert chat_of(req(text={"format": {"type": "json_object"}})).response_format.type == "json_object"
    assert chat_of(req(text={"format": {"type": "text"}})).response_format.type == "text"
    assert chat_of(req()).response_format is None


def test_chain_history_comes_between_instructions_and_the_new_input():
    earlier = [{"role": "user", "content": "one"}, {"role": "assistant", "content": "uno"}]
    chat = chat_of(req(input="two", instructions="Translate."), earlier)
    assert [(m.role, m.content) for m in chat.messages] == [("system", "Translate."), ("user", "one"),
                                                            ("assistant", "uno"), ("user", "two")]


@pytest.mark.parametrize("name", sorted(RESPONSES_REFUSED))
def test_every_refused_field_is_refused_by_name_and_its_default_is_not(name):
    served, _ = RESPONSES_REFUSED[name]
    for value in served:
        check_served(req(**{name: value}))
    other = {"truncation": "auto", "include": ["message.output_text.logprobs"], "top_logprobs": 3,
             "background": True, "service_tier": "flex", "context_management": [{"type": "compaction"}]}.get(
        name, {"anything": 1})
    err = refused(check_served, req(**{name: other}))
    assert err.param == name and name in err.message


@pytest.mark.parametrize("fields, param", [
    ({"reasoning": {"effort": "high"}}, "reasoning.effort"),
    ({"reasoning": {"effort": "none"}}, "reasoning.effort"),
    ({"reasoning": {"summary": "auto"}}, "reasoning.summary"),
    ({"text": {"verbosity": "low"}}, "text.verbosity"),
    ({"stream_options": {"include_obfuscation": True}}, "stream_options.include_obfuscation"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ({"metadata": {"k": "v" * 513}}, "metadata"),
])
def test_nested_values_not_served_are_refused_by_name(fields, param):
    assert refused(check_served, req(**fields)).param == param


def test_what_is_served_passes():
    check_served(req(reasoning={"effort": None}, text={"verbosity": "medium", "format": {"type": "text"}},
                     stream_options={"include_obfuscation": False}, metadata={"a": "b"}, truncation="disabled",
                     store=False, user="u", safety_identifier="s", prompt_cache_key="k"))


def test_every_field_of_the_openai_sdks_request_is_honoured_or_refused():
    """ResponseCreateParams, and the keys of the nested objects we read: a field neither served nor
    refused would be ignored."""
    from openai.types.responses import function_tool_param, response_create_params
    from openai.types.responses.response_format_text_json_schema_config_param import (
        ResponseFormatTextJSONSchemaConfigParam,
    )
    from openai.types.responses.response_text_config_param import ResponseTextConfigParam
    from openai.types.shared_params.reasoning import Reasoning

    fields = set(response_create_params.ResponseCreateParamsBase.__annotations__) | {"stream"}
    honoured = {"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens",
                "temperature", "top_p", "stream", "store", "previous_response_id", "text", "metadata",
                "prompt_cache_key", "stream_options", "reasoning"}  # reasoning: each key refused when set (below)
    no_effect = {"user", "safety_identifier"}  # identify the end user; they never change the output
    declared = set(ResponsesRequest.model_fields)
    assert fields <= declared, f"fields the router would drop unseen: {sorted(fields - declared)}"
    unclassified = fields - honoured - no_effect - set(RESPONSES_REFUSED)
    assert not unclassified, f"neither honoured nor refused: {sorted(unclassified)}"
    # nested: every reasoning key is refused when set; text: format honoured, verbosity refused past medium
    assert set(Reasoning.__annotations__) <= {"effort", "summary", "generate_summary", "context", "mode"}
    for key in Reasoning.__annotations__:
        assert refused(check_served, req(reasoning={key: "x"})).param == f"reasoning.{key}"
    assert set(ResponseTextConfigParam.__annotations__) == {"format", "verbosity"}
    assert set(ResponseFormatTextJSONSchemaConfigParam.__annotations__) <= {"name", "schema", "type", "description",
                                                                            "strict"}
    # a function tool's keys: those we convert, the others refused (extra keys are a 400)
    tool_keys = set(function_tool_param.FunctionToolParam.__annotations__)
    served_tool_keys = {"type", "name", "description", "parameters", "strict"}
    for key in tool_keys - served_tool_keys:
        tool = {"type": "function", "name": "f", key: True}
        assert refused(parse, ResponsesRequest, json.dumps({"input": "x", "tools": [tool]}).encode()).param == \
            f"tools.0.{key}"


def test_a_chat_side_error_names_the_responses_field():
    cases = [("max_completion_tokens", "max_completion_tokens=9 plus the prompt", "max_output_tokens"),
             ("prompt", "the prompt has 9 tokens", "input"), ("messages", "template failed", "input"),
             ("response_format.json_schema.schema", "rejected by worker", "text.format.schema"),
             ("tool_choice", "tool_choice 'required' and x", "tool_choice"), (None, "no param", None)]
    for chat, message, ours in cases:
        err = responses_param(bad_request(message, param=chat))
        assert err.param == ours
    assert responses_param(bad_request("max_completion_tokens=9 is too many", "max_completion_tokens")).message == \
        "max_output_tokens=9 is too many"
