"""router/http/tool_parsers.py on canned outputs of each family's call format: complete, streamed in
pieces, malformed (returned as text, as vLLM does)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from router.dispatch.service import parser_of
from router.http.tool_parsers import FAMILY_PARSER, AutoToolStream, parse

HERMES = ('I will look it up.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n'
          '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
LLAMA = '{"name": "get_weather", "parameters": {"city": "Oslo"}}; {"name": "get_time", "parameters": {}}'
MISTRAL = '[{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_time", "arguments": "{}"}]'


def calls_of(calls) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in calls]


@pytest.mark.parametrize("parser, text, content", [
    ("hermes", HERMES, "I will look it up."),
    ("llama3_json", LLAMA, None),
    ("llama3_json", "<|python_tag|>" + LLAMA, None),
    ("mistral", MISTRAL, None),
])
def test_a_complete_output_gives_its_calls_in_order(parser, text, content):
    got_content, calls = parse(parser, text)
    assert got_content == content
    names = [n for n, _ in calls_of(calls)]
    assert names == ["get_weather", "get_time"]
    assert calls_of(calls)[0][1]["city"] == "Oslo" and calls_of(calls)[1][1] == {}
    assert len({c.id for c in calls}) == 2 and all(c.id.startswith("call_") for c in calls)


@pytest.mark.parametrize("parser, text", [
    ("hermes", "The weather is fine, no tools needed."),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": </tool_call>'),  # broken JSON
    ("hermes", '<tool_call>{"arguments": {}}</tool_call>'),  # no name
    ("hermes", '<tool_call>{"name": "f", "arguments": {}'),  # never closed
    ("llama3_json", "Oslo is cold today."),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Oslo"}'),  # cut
    ("llama3_json", '{"temperature": 3}'),  # JSON, not a call
    ("mistral", '[{"name": "f", "arguments": [1]}]'),  # arguments not an object
    ("mistral", "[1, 2]"),
])
def test_anything_but_a_well_formed_call_is_returned_as_text(parser, text):
    assert parse(parser, text) == (text, [])


def stream_through(parser: str, text: str, finish: str = "stop", step: int = 3) -> tuple[str, list, str]:
    """Feed the output in pieces of `step` characters; (streamed content, calls, finish_reason)."""
    s, content, calls = AutoToolStream(parser), [], []
    for end in range(step, len(text) + step, step):
        if end >= len(text):
            break
        d = s.delta(text[:end])
        if d:
            assert "tool_calls" not in d
            content.append(d.get("content", ""))
    last, reason = s.finish(text, finish)
    content.append(last.get("content") or "")
    calls = last.get("tool_calls", [])
    return "".join(content), calls, reason


def test_streamed_hermes_sends_the_text_before_the_call_and_never_a_piece_of_the_tag():
    content, calls, reason = stream_through("hermes", HERMES)
    assert content.strip() == "I will look it up." and "<" not in content
    assert reason == "tool_calls" and [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert [c["index"] for c in calls] == [0, 1]
    held = AutoToolStream("hermes")
    assert held.delta("Hi <tool_") == {"role": "assistant", "content": "Hi "}  # "<tool_" may start a call


@pytest.mark.parametrize("parser, text", [("llama3_json", LLAMA), ("mistral", MISTRAL)])
def test_streamed_json_formats_hold_the_output_and_send_the_calls_at_the_end(parser, text):
    content, calls, reason = stream_through(parser, text)
    assert content == "" and reason == "tool_calls" and len(calls) == 2


@pytest.mark.parametrize("parser", ["hermes", "llama3_json", "mistral"])
def test_plain_text_streams_whole_and_a_cut_call_comes_back_as_text(parser):
    text = "It is sunny in Oslo today, about 20 degrees."
    assert stream_through(parser, text) == (text, [], "stop")
    cut = {"hermes": HERMES[:60], "llama3_json": LLAMA[:30], "mistral": MISTRAL[:30]}[parser]
    content, calls, reason = stream_through(parser, cut, finish="length")
    assert (content, calls, reason) == (cut, [], "length")


def test_the_parser_follows_the_models_family(tmp_path: Path):
    def family(arch: str) -> str:
        d = tmp_path / arch
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"architectures": [arch]}))
        return parser_of("auto", d, FAMILY_PARSER)

    assert family("Qwen2ForCausalLM") == family("Qwen3ForCausalLM") == "hermes"
    assert family("LlamaForCausalLM") == "llama3_json" and family("MistralForCausalLM") == "mistral"
    assert family("GPT2LMHeadModel") == "none" and parser_of("auto", None, FAMILY_PARSER) == "none"
    assert parser_of("hermes", None, FAMILY_PARSER) == "hermes"
