"""Every request field is honoured or refused, never accepted and ignored: the fields of the installed
`openai` SDK's request types, walked recursively (messages' parts, tools' function, response_format,
stream_options, ...), and vLLM's request fields (data below), for chat and completions.

Each field is in exactly one class: honoured (declared in the router's body models, and shown by a
test that exercises it), accepted with no effect on the output (docs/api.md says why), or refused (a
body with it is a 400 naming it, through the real router, and nothing reaches a worker). A refused
or no-effect field covers what is nested under it (a value that is refused never gets that far).
"""

from __future__ import annotations

import collections.abc
import json
import pathlib
import re
import types
import typing

import httpx
import pytest
import typing_extensions
from pydantic import BaseModel

from pdorch.local_stack.processes import free_port
from pdorch.local_stack.router import RouterThread, router_config
from pdorch.local_stack.standin import StandinServer
from router.http.bodies import ChatCompletionRequest, CompletionRequest

ROOT = pathlib.Path(__file__).resolve().parents[2]
MESSAGES = [{"role": "user", "content": "hi"}]

# vLLM's request fields, copied from vLLM's source on its main branch at commit
# 002032ee2b18e1f7bd924ec47b62504ba3866063 (vllm/entrypoints/openai/chat_completion/protocol.py
# ChatCompletionRequest, completion/protocol.py CompletionRequest; stream_options: StreamOptions of
# entrypoints/generate/base/protocol.py).
VLLM_COMMON = [
    "model", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n", "presence_penalty",
    "response_format", "seed", "stop", "stream", "stream_options", "stream_options.include_usage",
    "stream_options.continuous_usage_stats", "temperature", "top_p", "user", "use_beam_search", "top_k", "min_p",
    "repetition_penalty", "watermarking", "length_penalty", "stop_token_ids", "include_stop_str_in_output",
    "ignore_eos", "min_tokens", "skip_special_tokens", "spaces_between_special_tokens", "truncate_prompt_tokens",
    "truncation_side", "prompt_logprobs", "logprob_token_ids", "allowed_token_ids", "bad_words",
    "add_special_tokens", "structured_outputs", "priority", "request_id", "session_id",
    "return_tokens_as_token_ids", "return_token_ids", "routed_experts_prompt_start", "return_token_offsets",
    "return_mm_kwargs", "cache_salt", "kv_transfer_params", "ec_transfer_params", "vllm_xargs",
    "repetition_detection", "thinking_token_budget", "stream_interval",
]
VLLM_CHAT = VLLM_COMMON + [
    "messages", "top_logprobs", "max_completion_tokens", "tools", "tool_choice", "reasoning_effort",
    "include_reasoning", "parallel_tool_calls", "echo", "add_generation_prompt", "continue_final_message",
    "documents", "chat_template", "chat_template_kwargs", "media_io_kwargs", "mm_processor_kwargs",
    "return_prompt_text",
]
VLLM_COMPLETION = VLLM_COMMON + ["prompt", "echo", "suffix", "prompt_embeds"]

# honoured: field -> the test file that exercises it (it must name the field)
HONOURED_COMMON = {
    "model": "tests/unit/test_router_api.py", "temperature": "tests/unit/test_router_structured.py",
    "top_p": "tests/unit/test_router_structured.py", "top_k": "tests/unit/test_router_structured.py",
    "min_p": "tests/unit/test_router_api.py", "seed": "tests/unit/test_router_api.py",
    "max_tokens": "tests/unit/test_router_api.py", "n": "tests/unit/test_router_api.py",
    "stop": "tests/unit/test_router_api.py", "stop_token_ids": "tests/unit/test_router_bad_input.py",
    "ignore_eos": "tests/integration/test_agent_api.py", "stream": "tests/unit/test_router_api.py",
    "stream_options": "tests/unit/test_router_api.py", "stream_options.include_usage": "tests/unit/test_router_api.py",
    "stream_options.continuous_usage_stats": "tests/unit/test_router_api.py",
    "logprobs": "tests/integration/test_agent_api.py", "frequency_penalty": "tests/integration/test_agent_api.py",
    "presence_penalty": "tests/integration/test_agent_api.py",
    "repetition_penalty": "tests/unit/test_router_structured.py", "logit_bias": "tests/integration/test_agent_api.py",
    "min_tokens": "tests/integration/test_agent_api.py", "response_format": "tests/unit/test_router_structured.py",
    "response_format.type": "tests/unit/test_router_structured.py",
    "response_format.json_schema": "tests/unit/test_router_structured.py",
    "response_format.json_schema.schema": "tests/unit/test_router_structured.py",
    "structured_outputs": "tests/unit/test_router_structured.py",
    "include_stop_str_in_output": "tests/integration/test_sampling_fields.py",
    "skip_special_tokens": "tests/integration/test_sampling_fields.py",
    "spaces_between_special_tokens": "tests/unit/test_router_vllm_extras.py",
    "allowed_token_ids": "tests/integration/test_sampling_fields.py",
    "bad_words": "tests/integration/test_sampling_fields.py",
    "prompt_logprobs": "tests/integration/test_sampling_fields.py",
    "request_id": "tests/unit/test_router_vllm_extras.py", "session_id": "tests/unit/test_router_vllm_extras.py",
}
HONOURED_CHAT = HONOURED_COMMON | {
    "messages": "tests/unit/test_router_api.py", "messages[].role": "tests/unit/test_router_structured.py",
    "messages[].content": "tests/unit/test_router_structured.py",
    "messages[].content[].type": "tests/unit/test_router_vllm_extras.py",
    "messages[].content[].text": "tests/unit/test_router_vllm_extras.py",
    "messages[].name": "tests/unit/test_router_vllm_extras.py",
    "messages[].tool_calls": "tests/unit/test_router_structured.py",
    "messages[].tool_calls[].id": "tests/integration/test_agent_api.py",
    "messages[].tool_calls[].type": "tests/integration/test_agent_api.py",
    "messages[].tool_calls[].function": "tests/unit/test_router_structured.py",
    "messages[].tool_calls[].function.name": "tests/unit/test_router_structured.py",
    "messages[].tool_calls[].function.arguments": "tests/unit/test_router_structured.py",
    "messages[].tool_call_id": "tests/unit/test_router_structured.py",
    "max_completion_tokens": "tests/unit/test_router_bad_input.py",
    "top_logprobs": "tests/integration/test_agent_api.py", "tools": "tests/unit/test_router_structured.py",
    "tools[].type": "tests/unit/test_router_structured.py", "tools[].function": "tests/unit/test_router_structured.py",
    "tools[].function.name": "tests/unit/test_router_structured.py",
    "tools[].function.description": "tests/integration/test_agent_api.py",
    "tools[].function.parameters": "tests/unit/test_router_structured.py",
    "chat_template_kwargs": "tests/unit/test_router_vllm_extras.py",
    "add_generation_prompt": "tests/unit/test_router_vllm_extras.py",
    "tools[].function.strict": "tests/unit/test_router_structured.py",
    "response_format.json_schema.strict": "tests/integration/test_agent_frameworks.py",
    "parallel_tool_calls": "tests/unit/test_router_structured.py",
    "messages[].reasoning_content": "tests/unit/test_router_structured.py",
    "tool_choice": "tests/unit/test_router_structured.py", "tool_choice.type": "tests/unit/test_router_structured.py",
    "tool_choice.function": "tests/unit/test_router_structured.py",
    "tool_choice.function.name": "tests/unit/test_router_structured.py",
    "tool_choice.allowed_tools": "tests/unit/test_router_structured.py",
    "tool_choice.allowed_tools.mode": "tests/unit/test_router_structured.py",
    "tool_choice.allowed_tools.tools": "tests/unit/test_router_structured.py",
    "continue_final_message": "tests/unit/test_router_chat_templates.py",
}
HONOURED_COMPLETION = HONOURED_COMMON | {"prompt": "tests/unit/test_router_api.py",
                                        "echo": "tests/integration/test_agent_api.py"}

# accepted with no effect on the output: field -> why (docs/api.md, "Accepted with no effect on the output")
NO_EFFECT = {
    "user": "identifies the end user to OpenAI's abuse checks",
    "safety_identifier": "identifies the end user to OpenAI's abuse checks",
    "prompt_cache_key": "a cache-routing hint: the router's session key",
    "response_format.json_schema.name": "names the schema; vLLM and SGLang ignore it too",
    "response_format.json_schema.description": "describes the schema to the model; vLLM and SGLang ignore it too",
    "messages[].content[].prompt_cache_breakpoint": "a caching hint: every full page is cached anyway",
}


# refused: field -> (the body's fields that carry it, the `param` its 400 names); a field of the
# router's REFUSED tables is refused with any value but its default
REFUSED_COMMON = ["use_beam_search", "length_penalty", "watermarking", "truncate_prompt_tokens", "truncation_side",
                  "logprob_token_ids", "add_special_tokens", "priority", "return_tokens_as_token_ids",
                  "return_token_ids", "return_token_offsets", "return_mm_kwargs", "routed_experts_prompt_start",
                  "cache_salt", "kv_transfer_params", "ec_transfer_params", "vllm_xargs", "repetition_detection",
                  "thinking_token_budget", "stream_interval"]
REFUSED_CHAT = {name: ({name: {"x": 1}}, name) for name in REFUSED_COMMON + [
    "audio", "function_call", "functions", "metadata", "modalities", "moderation", "prediction",
    "prompt_cache_options", "prompt_cache_retention", "reasoning_effort", "service_tier", "store", "verbosity",
    "web_search_options", "echo", "documents", "media_io_kwargs", "mm_processor_kwargs", "include_reasoning",
    "return_prompt_text"]}
REFUSED_CHAT |= {
    "stream_options.include_obfuscation": ({"stream": True, "stream_options": {"include_obfuscation": True}},
                                           "stream_options.include_obfuscation"),
    "messages[].audio": ({"messages": [{"role": "assistant", "audio": {"id": "a1"}}]}, "messages.0.audio"),
    "messages[].refusal": ({"messages": [{"role": "assistant", "refusal": "no"}]}, "messages.0.refusal"),
    "messages[].function_call": ({"messages": [{"role": "assistant", "function_call": {"name": "f",
                                                                                       "arguments": "{}"}}]},
                                 "messages.0.function_call"),
    "messages[].content[].image_url": ({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}, "messages.0.content.0.type"),
    "messages[].content[].input_audio": ({"messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}}]}]}, "messages.0.content.0.type"),
    "messages[].content[].file": ({"messages": [{"role": "user", "content": [
        {"type": "file", "file": {"file_id": "f1"}}]}]}, "messages.0.content.0.type"),
    "messages[].content[].refusal": ({"messages": [{"role": "assistant", "content": [
        {"type": "refusal", "refusal": "no"}]}]}, "messages.0.content.0.type"),
    "messages[].tool_calls[].custom": ({"messages": [{"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "custom", "custom": {"name": "f", "input": "x"}}]}]}, "messages.0.tool_calls.0.type"),
    "tools[].custom": ({"tools": [{"type": "custom", "custom": {"name": "f"}}]}, "tools.0.type"),
    "tool_choice.custom": ({"tools": [{"type": "function", "function": {"name": "f"}}],
                            "tool_choice": {"type": "custom", "custom": {"name": "f"}}}, "tool_choice"),
    "chat_template": ({"chat_template": "{{ messages }}"}, "chat_template"),
}
REFUSED_COMPLETION = {name: ({name: {"x": 1}}, name) for name in REFUSED_COMMON + [
    "best_of", "suffix", "top_logprobs", "prompt_embeds"]}
REFUSED_COMPLETION["stream_options.include_obfuscation"] = REFUSED_CHAT["stream_options.include_obfuscation"]

ROUTES = {"chat": ("/v1/chat/completions", ChatCompletionRequest, HONOURED_CHAT, REFUSED_CHAT, VLLM_CHAT),
          "completions": ("/v1/completions", CompletionRequest, HONOURED_COMPLETION, REFUSED_COMPLETION,
                          VLLM_COMPLETION)}


def sdk_fields(route: str) -> set[str]:
    """Every field of the openai SDK's create params for `route`, nested ones as `a.b` (`a[]` for list items)."""
    if route == "chat":
        from openai.types.chat import completion_create_params as params
    else:
        from openai.types import completion_create_params as params
    out: set[str] = set()
    for cls in (params.CompletionCreateParamsNonStreaming, params.CompletionCreateParamsStreaming):
        _walk(cls, "", out, set())
    return out


def _walk(t, path: str, out: set[str], seen: set) -> None:
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin in (typing.Annotated, typing_extensions.Required, typing_extensions.NotRequired, typing.Required,
                  typing.NotRequired):
        _walk(args[0], path, out, seen)
    elif typing_extensions.is_typeddict(t):
        for name, hint in typing_extensions.get_type_hints(t, include_extras=True).items():
            field = f"{path}.{name}" if path else name
            out.add(field)
            if (t, name) not in seen:
                _walk(hint, field, out, seen | {(t, name)})
    elif origin is typing.Union or isinstance(t, types.UnionType):
        for a in args:
            _walk(a, path, out, seen)
    elif origin in (list, collections.abc.Iterable, collections.abc.Sequence):
        _walk(args[0], path + "[]", out, seen)


def classify(route: str, field: str) -> str:
    """honoured / no_effect / refused, by the field or the nearest class covering it; "" if none."""
    _, _, honoured, refused, _ = ROUTES[route]
    if field in honoured:
        return "honoured"
    at = covering(field, refused.keys() | NO_EFFECT.keys())
    if at is None:
        return ""
    return "refused" if at in refused else "no_effect"


def covering(field: str, fields) -> str | None:
    """The nearest of `fields` that is `field` or holds it (`a[].b` is held by `a[]` and `a`)."""
    parts = field.split(".")
    for n in range(len(parts), 0, -1):
        at = ".".join(parts[:n])
        for name in (at, at.removesuffix("[]")):
            if name in fields:
                return name
    return None


@pytest.mark.parametrize("route", ROUTES)
def test_every_field_of_the_sdk_and_of_vllm_is_honoured_refused_or_without_effect(route):
    fields = sdk_fields(route) | set(ROUTES[route][4])
    assert len(sdk_fields("chat")) > 100 and "messages[].content[].text" in sdk_fields("chat")  # the walk goes deep
    unclassified = sorted(f for f in fields if not classify(route, f))
    assert not unclassified, f"{route}: fields neither honoured nor refused: {unclassified}"


def declared(model: type[BaseModel], field: str) -> bool:
    """Whether the router's body model reads `field` (a path): each part a declared field of the model
    the part before leads to; an opaque value (a dict: a JSON schema, ...) ends the path."""
    cls: object = model
    for part in field.replace("[]", "").split("."):
        models = _models(cls)
        if not models:
            return True  # inside a dict or Any: the value is taken whole
        found = [m.model_fields[n] for m in models for n in m.model_fields
                 if n == part or m.model_fields[n].alias == part]
        if not found:
            return False
        cls = found[0].annotation
    return True


def _models(t) -> list[type[BaseModel]]:
    if isinstance(t, type) and issubclass(t, BaseModel):
        return [t]
    return [m for a in typing.get_args(t) for m in _models(a)]


def _cases(kind: str) -> list[tuple[str, str]]:
    out = []
    for route in ROUTES:
        for field in sorted(sdk_fields(route) | set(ROUTES[route][4])):
            if classify(route, field) == kind:
                out.append((route, field))
    return out


@pytest.mark.parametrize("route, field", _cases("honoured"))
def test_an_honoured_field_is_read_and_a_test_exercises_it(route, field):
    _, model, honoured, _, _ = ROUTES[route]
    assert declared(model, field), f"{field} is not read by {model.__name__}: it would be dropped unseen"
    test_file = ROOT / honoured[field]
    leaf = field.split(".")[-1].replace("[]", "")
    assert test_file.is_file() and leaf in test_file.read_text(), f"{honoured[field]} does not exercise {field}"


def api_sections() -> dict[str, str]:
    """docs/api.md by its `## ` sections."""
    text = (ROOT / "docs" / "api.md").read_text()
    return {part.split("\n", 1)[0]: part for part in text.split("\n## ")}


def documented(name: str, text: str) -> bool:
    """`name` in a code span of `text` (alone or in a path such as `a.b`)."""
    return re.search(r"`[^`\n]*\b" + re.escape(name) + r"\b[^`\n]*`", text) is not None


@pytest.mark.parametrize("route, field", _cases("no_effect"))
def test_a_field_without_effect_is_read_and_documented(route, field):
    assert declared(ROUTES[route][1], field)
    at = covering(field, NO_EFFECT)
    section = api_sections()["Accepted with no effect on the output"]
    assert documented(at.split(".")[-1].replace("[]", ""), section), f"docs/api.md does not say why {at} has no effect"


@pytest.fixture(scope="module")
def router(router_tokenizer, tiny_model_dir):
    p, d = StandinServer("prefill", free_port()).start(), StandinServer("decode", free_port()).start()
    r = RouterThread(router_config([p.address], [d.address], policy="round_robin"), router_tokenizer,
                     tiny_model_dir).start()
    try:
        yield r, d
    finally:
        r.stop()
        p.stop()
        d.stop()


@pytest.mark.parametrize("route, field", _cases("refused"))
def test_a_refused_field_is_a_400_naming_it(router, route, field):
    r, d = router
    path, _, _, refused, _ = ROUTES[route]
    extra, param = refused[covering(field, refused)]
    body = {"messages": MESSAGES} if route == "chat" else {"prompt": "hi"}
    calls = len(d.behavior.calls)
    resp = httpx.post(r.url + path, json={**body, "max_tokens": 2, **extra}, timeout=20)
    assert resp.status_code == 400, (field, resp.text)
    err = resp.json()["error"]
    assert err["param"] == param and param.split(".")[-1] in err["message"], err
    assert len(d.behavior.calls) == calls  # nothing reached a worker


def test_the_refused_defaults_are_served(router):
    """What clients send as defaults (vLLM's own) is no 400."""
    r, _ = router
    defaults = {"use_beam_search": False, "length_penalty": 1.0, "priority": 0, "return_token_ids": False,
                "return_mm_kwargs": True, "thinking_token_budget": -1, "skip_special_tokens": True,
                "include_stop_str_in_output": False, "spaces_between_special_tokens": True, "bad_words": [],
                "echo": False, "include_reasoning": True, "add_special_tokens": False, "service_tier": "auto"}
    resp = httpx.post(r.url + "/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 2, **defaults},
                      timeout=20)
    assert resp.status_code == 200, resp.text
    body = json.loads(resp.text)
    assert body["choices"][0]["finish_reason"] == "length"
