"""router/http/reasoning.py and router/http/chat_output.py: thinking split into reasoning_content, whole and
streamed, alone and before a tool call."""

from __future__ import annotations

import json

import pytest

from router.http.chat_output import ChatShape
from router.http.formats import Progress
from router.http.reasoning import ReasoningStream, split

THOUGHT = "<think>\nThe user wants Oslo's weather.\nI should say it is cold.\n</think>\n\nIt is cold in Oslo."


@pytest.mark.parametrize("parser, text, reasoning, content", [
    ("qwen3", THOUGHT, "The user wants Oslo's weather.\nI should say it is cold.", "It is cold in Oslo."),
    ("qwen3", "It is cold in Oslo.", None, "It is cold in Oslo."),  # enable_thinking false: no block
    ("qwen3", "<think>\nstill thinking", "still thinking", ""),  # cut before </think>
    ("deepseek_r1", "weighing it up</think>Cold.", "weighing it up", "Cold."),
    ("deepseek_r1", "<think>weighing</think>Cold.", "weighing", "Cold."),
    ("deepseek_r1", "no end yet", "no end yet", ""),
])
def test_split(parser, text, reasoning, content):
    assert split(parser, text) == (reasoning, content)


def feed_all(stream: ReasoningStream, text: str, step: int = 2) -> tuple[str, str]:
    thinking, content = [], ""
    for end in range(step, len(text) + step, step):
        new, content = stream.feed(text[:end])
        thinking.append(new)
    return "".join(thinking), content


def test_streamed_thinking_never_shows_a_piece_of_a_tag():
    thinking, content = feed_all(ReasoningStream("qwen3"), THOUGHT)
    assert "<" not in thinking and thinking.strip() == "The user wants Oslo's weather.\nI should say it is cold."
    assert content == "It is cold in Oslo."
    s = ReasoningStream("qwen3")
    assert s.feed("<thi") == ("", "")  # may become <think>
    assert s.feed("<think>abc</th") == ("abc", "")  # may become </think>
    assert ReasoningStream("qwen3").feed("Hello") == ("", "Hello")


def run_stream(shape: ChatShape, text: str, finish: str = "stop", step: int = 3) -> list[dict]:
    """The chunks' (delta, finish_reason) as a client reads them."""
    chunk = shape.stream(False)
    p, out = Progress("r", 5), []
    for end in range(step, len(text) + step, step):
        p.text = text[:end]
        if end >= len(text):
            p.finish_reason = finish
        body = chunk(p, "id", 0, "m", "", end == step, False)
        if body:
            choice = json.loads(body[len(b"data: "):])["choices"][0]
            out.append((choice["delta"], choice["finish_reason"]))
    return out


@pytest.mark.parametrize("step", [3, 40, len(THOUGHT)])  # the last: the whole output in its final chunk
def test_a_reasoning_chat_streams_thinking_then_content_and_ends_once(step):
    chunks = run_stream(ChatShape(None, "none", "qwen3"), THOUGHT, step=step)
    assert chunks[0][0]["role"] == "assistant" and sum("role" in d for d, _ in chunks) == 1
    thinking = "".join(d.get("reasoning_content", "") for d, _ in chunks)
    content = "".join(d.get("content", "") for d, _ in chunks)
    assert thinking.strip() == "The user wants Oslo's weather.\nI should say it is cold."
    assert content == "It is cold in Oslo." and [f for _, f in chunks if f] == ["stop"]
    msg, _finish = ChatShape(None, "none", "qwen3").message(THOUGHT, "stop")
    assert msg["reasoning_content"].startswith("The user") and msg["content"] == "It is cold in Oslo."


def test_thinking_before_a_tool_call_goes_to_reasoning_and_the_call_to_tool_calls():
    from router.http.tools import ToolPlan

    text = '<think>\nNeed the weather tool.\n</think>\n\n<tool_call>\n{"name": "w", "arguments": {"c": 1}}\n</tool_call>'
    shape = ChatShape(ToolPlan("auto", [{"type": "function", "function": {"name": "w"}}]), "hermes", "qwen3")
    msg, finish = shape.message(text, "stop")
    assert finish == "tool_calls" and msg["reasoning_content"] == "Need the weather tool."
    assert msg["tool_calls"][0]["function"]["name"] == "w" and not msg["content"]
    chunks = run_stream(shape, text)
    assert "".join(d.get("content") or "" for d, _ in chunks) == ""
    assert chunks[-1][1] == "tool_calls" and chunks[-1][0]["tool_calls"][0]["function"]["name"] == "w"
    assert "Need the weather tool." in "".join(d.get("reasoning_content", "") for d, _ in chunks)


def test_a_plain_chat_takes_the_fast_path():
    assert ChatShape(None, "llama3_json", "none").plain and ChatShape(None, "none", "none").message("x", "stop") == (None, None)
