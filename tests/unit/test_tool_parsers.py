"""router/http/tool_parsers.py on canned outputs of each family's call format: whole and streamed in
pieces cut at every position (the two must agree), the false positives of issue 51 (text), the
OpenAI delta shape of streamed calls, call ids."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from router.http.service import parser_of
from router.http.tool_parsers import FAMILY_PARSER, AutoToolStream, parse

NAMES = ("get_weather", "get_time")
HERMES = ('I will look it up.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n'
          '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
LLAMA = '{"name": "get_weather", "parameters": {"city": "Oslo"}}; {"name": "get_time", "parameters": {}}'
MISTRAL = '[{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_time", "arguments": "{}"}]'

# (parser, output, content, [(name, arguments)]) of whole outputs; every one is also streamed below
CASES = [
    ("hermes", HERMES, "I will look it up.", [("get_weather", {"city": "Oslo", "days": 2}), ("get_time", {})]),
    ("hermes", HERMES + "\nThat is all.", "I will look it up.\nThat is all.",  # text after a call is kept
     [("get_weather", {"city": "Oslo", "days": 2}), ("get_time", {})]),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "</tool_call> <tool_call>"}}\n</tool_call>',
     None, [("get_weather", {"city": "</tool_call> <tool_call>"})]),  # tags inside a string are the string's
    ("hermes", '<tool_call>{"name": "get_time", "arguments": {"tz": "Zürich 東京"}}</tool_call>', None,
     [("get_time", {"tz": "Zürich 東京"})]),
    ("hermes", '<tool_call>{"name": "get_time", "arguments": {}}', None, [("get_time", {})]),  # JSON closed, tag not
    ("hermes", '<tool_call>{"arguments": {"city": "Rome"}, "name": "get_weather"}</tool_call>', None,
     [("get_weather", {"city": "Rome"})]),  # another key order: judged once the object closes
    ("hermes", "  Let me check the weather.", "  Let me check the weather.", []),
    ("llama3_json", LLAMA, None, [("get_weather", {"city": "Oslo"}), ("get_time", {})]),
    ("llama3_json", "<|python_tag|>" + LLAMA, None, [("get_weather", {"city": "Oslo"}), ("get_time", {})]),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Oslo; Bergen"}}', None,
     [("get_weather", {"city": "Oslo; Bergen"})]),  # a ";" inside an argument splits nothing
    ("llama3_json", '{"name": "get_time", "arguments": {}}', None, [("get_time", {})]),
    ("mistral", MISTRAL, None, [("get_weather", {"city": "Oslo"}), ("get_time", {})]),
    ("mistral", "[TOOL_CALLS]" + MISTRAL, None, [("get_weather", {"city": "Oslo"}), ("get_time", {})]),
]
# outputs that are text, each with its reason (issue 51's false positives among them)
TEXT = [
    ("hermes", "The weather is fine, no tools needed."),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": </tool_call>'),  # broken JSON
    ("hermes", '<tool_call>{"arguments": {}}</tool_call>'),  # no name
    ("hermes", '<tool_call>{"name": "get_time"}</tool_call>'),  # no arguments
    ("hermes", '<tool_call>{"name": "get_time", "arguments": {}'),  # never closed
    ("hermes", 'Sure.\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"'),  # the last call never closed
    ("hermes", '<tool_call>{"name": "launch_rocket", "arguments": {}}</tool_call>'),  # no such tool
    ("llama3_json", "Oslo is cold today."),
    ("llama3_json", '{"name": "Alice", "age": 30}'),  # a JSON answer, not a tool named Alice
    ("llama3_json", '{"name": "get_time"}'),  # no arguments
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Oslo"}'),  # cut
    ("llama3_json", '{"temperature": 3}'),  # JSON, not a call
    ("llama3_json", 'I think {"name": "get_time", "parameters": {}}'),  # the format is the whole output
    ("mistral", '[{"name": "get_weather", "arguments": [1]}]'),  # arguments not an object
    ("mistral", "[1, 2]"),
    ("mistral", '[{"name": "Alice", "arguments": {}}]'),
]

# of those, the ones whose call opens in a stream before the output shows it is text (module docstring)
OPENED_THEN_TEXT = {TEXT[1][1], TEXT[4][1], TEXT[5][1], TEXT[10][1]}


def calls_of(calls) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in calls]


def stream(parser: str, text: str, cuts, finish: str = "stop", names=NAMES, max_calls=None):
    """The output fed as text[:k] for each k of `cuts`, then whole: (content, [(name, arguments)],
    finish_reason, every tool_calls delta)."""
    s, content, deltas = AutoToolStream(parser, names, max_calls), [], []
    for k in cuts:
        d = s.delta(text[:k]) or {}
        content.append(d.get("content", ""))
        deltas += d.get("tool_calls", [])
    last, reason = s.finish(text, finish)
    content.append(last.get("content", ""))
    deltas += last.get("tool_calls", [])
    calls: dict[int, list] = {}
    for d in deltas:
        if "id" in d:
            assert d["index"] == len(calls) and d["type"] == "function" and d["id"]
            calls[d["index"]] = [d["function"]["name"], d["function"]["arguments"]]
        else:
            assert set(d) == {"index", "function"} and set(d["function"]) == {"arguments"}
            calls[d["index"]][1] += d["function"]["arguments"]
    return "".join(content), [tuple(c) for c in calls.values()], reason, deltas


def every_cut(text: str):
    yield range(1, len(text))  # one character per chunk
    for k in range(1, len(text)):
        yield [k]  # two pieces, cut at k


@pytest.mark.parametrize("parser, text, content, calls", CASES)
def test_a_whole_output_gives_its_content_and_calls(parser, text, content, calls):
    got_content, got = parse(parser, text, NAMES)
    assert (got_content, calls_of(got)) == (content if calls else text, calls)


@pytest.mark.parametrize("parser, text", TEXT)
def test_anything_but_a_well_formed_call_of_a_listed_tool_is_text(parser, text):
    assert parse(parser, text, NAMES) == (text, [])


@pytest.mark.parametrize("parser, text, content, calls", CASES + [(p, t, t, []) for p, t in TEXT])
def test_streamed_cut_at_every_position_gives_what_the_whole_output_gives(parser, text, content, calls):
    """Content, calls (names and argument text) and finish_reason, for every cut. NOTE: a call whose
    JSON never closes has streamed its name and arguments so far before the end shows it is text
    (the module docstring): there the content agrees and no further call is sent."""
    whole_content, whole_calls = parse(parser, text, NAMES)
    whole = [(c.name, c.arguments) for c in whole_calls]
    for cuts in every_cut(text):
        got_content, got_calls, reason, _ = stream(parser, text, cuts)
        assert got_content == (whole_content or ""), cuts
        assert got_calls == whole or (text in OPENED_THEN_TEXT and got_calls[:len(whole)] == whole), cuts
        assert reason == ("tool_calls" if calls else "stop")


@pytest.mark.parametrize("parser, text", [("hermes", HERMES), ("llama3_json", LLAMA), ("mistral", MISTRAL)])
def test_a_calls_arguments_stream_as_they_are_written(parser, text):
    """The first delta of a call carries index, id, type and name; its arguments follow in pieces
    that arrive before the output is over."""
    cut = text.index('"Oslo"') + 3
    s = AutoToolStream(parser, NAMES)
    early = [d for k in range(1, cut) for d in (s.delta(text[:k]) or {}).get("tool_calls", [])]
    assert early[0]["function"]["name"] == "get_weather" and early[0]["index"] == 0
    assert "".join(d["function"]["arguments"] for d in early) == '{"city": "O'


def test_text_before_a_hermes_call_streams_and_no_piece_of_a_tag_does():
    s = AutoToolStream("hermes", NAMES)
    assert s.delta("Hi <tool_") == {"content": "Hi"}  # "<tool_" may start a call; the blank may precede one
    assert s.delta("Hi <tool_b") == {"content": " <tool_b"}
    content, _, _, _ = stream("hermes", HERMES, range(1, len(HERMES)))
    assert content == "I will look it up." and "<" not in content


def test_an_unknown_name_is_text_as_soon_as_it_is_read():
    s = AutoToolStream("llama3_json", NAMES)
    assert s.delta('{"name": "Ali') is None  # may still be a call
    assert s.delta('{"name": "Alice", ') == {"content": '{"name": "Alice", '}


def test_parallel_tool_calls_false_keeps_the_first_call():
    content, calls, reason, _ = stream("hermes", HERMES, range(1, len(HERMES)), max_calls=1)
    assert content == "I will look it up." and calls == [("get_weather", '{"city": "Oslo", "days": 2}')] and reason == "tool_calls"


def test_a_call_cut_at_max_tokens_ends_with_length():
    cut = HERMES[:HERMES.index("Oslo")]
    content, _calls, reason, _ = stream("hermes", cut, range(1, len(cut)), finish="length")
    assert reason == "length" and content == cut and parse("hermes", cut, NAMES) == (cut, [])


def test_call_ids_mistral_nine_alphanumerics_others_call_prefixed():
    _, calls = parse("mistral", MISTRAL, NAMES)
    assert all(re.fullmatch(r"[A-Za-z0-9]{9}", c.id) for c in calls) and len({c.id for c in calls}) == 2
    *_, deltas = stream("mistral", MISTRAL, [len(MISTRAL) - 1])
    assert all(re.fullmatch(r"[A-Za-z0-9]{9}", d["id"]) for d in deltas if "id" in d)
    _, calls = parse("hermes", HERMES, NAMES)
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", c.id) for c in calls)


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
