"""router/http/reasoning.py and router/http/chat_output.py: thinking split into reasoning_content, whole and
streamed, alone and before a tool call."""

from __future__ import annotations

import json

import pytest

from router.http.chat_output import ChatShape
from router.http.formats import Progress, chat_delta_chunk
from router.http.reasoning import INSIDE, MAY_OPEN, NO_THINKING, ReasoningStream, split, start_of

THOUGHT = "<think>\nThe user wants Oslo's weather.\nI should say it is cold.\n</think>\n\nIt is cold in Oslo."


def feed_all(stream: ReasoningStream, text: str, step: int = 2) -> tuple[str, str]:
    thinking, content = [], ""
    for end in range(step, len(text) + step, step):
        new, content = stream.feed(text[:end], final=end >= len(text))
        thinking.append(new)
    return "".join(thinking), content


def test_streamed_thinking_never_shows_a_piece_of_a_tag():
    thinking, content = feed_all(ReasoningStream("qwen3"), THOUGHT)
    assert "<" not in thinking and thinking == "The user wants Oslo's weather.\nI should say it is cold."
    assert content == "It is cold in Oslo."
    s = ReasoningStream("qwen3")
    assert s.feed("<thi") == ("", "")  # may become <think>
    assert s.feed("<think>abc</th") == ("abc", "")  # may become </think>
    assert ReasoningStream("qwen3").feed("Hello") == ("", "Hello")


@pytest.mark.parametrize("tail, parser, start", [
    ("<|im_start|>assistant\n", "qwen3", MAY_OPEN),  # Qwen3, thinking on: the model opens <think>
    ("<|im_start|>assistant\n<think>\n", "qwen3", INSIDE),  # Qwen3-2507 Thinking: the template opened it
    ("<|im_start|>assistant\n<think>\n\n</think>\n\n", "qwen3", NO_THINKING),  # enable_thinking false
    ("<｜Assistant｜>", "deepseek_r1", INSIDE),
    ("<|im_start|>assistant\n", "none", NO_THINKING),
])
def test_where_the_output_starts_is_read_from_the_end_of_the_prompt(tail, parser, start):
    assert start_of(parser, tail) == start


# (parser, where it starts, output, reasoning, content): issue 51's cases among them
OUTPUTS = [
    ("qwen3", MAY_OPEN, THOUGHT, "The user wants Oslo's weather.\nI should say it is cold.", "It is cold in Oslo."),
    ("qwen3", MAY_OPEN, "It is cold in Oslo.", None, "It is cold in Oslo."),
    ("qwen3", MAY_OPEN, "<think>\nstill thinking", "still thinking", ""),
    # a template that opened <think>: the output starts inside it, and no </think> reaches content
    ("qwen3", INSIDE, "The user asks.\nCold.\n</think>\n\nIt is cold.", "The user asks.\nCold.", "It is cold."),
    ("qwen3", INSIDE, "still thinking\n\n", "still thinking", ""),
    ("qwen3", NO_THINKING, "<think>x</think>y", None, "<think>x</think>y"),
    ("deepseek_r1", INSIDE, "weighing it up</think>Cold.", "weighing it up", "Cold."),
    ("deepseek_r1", INSIDE, "<think>weighing</think>Cold.", "weighing", "Cold."),
    ("deepseek_r1", INSIDE, " Okay, a leading space.</think> Cold.", " Okay, a leading space.", " Cold."),
    ("deepseek_r1", INSIDE, "no end yet", "no end yet", ""),
]


@pytest.mark.parametrize("parser, start, text, reasoning, content", OUTPUTS)
def test_split(parser, start, text, reasoning, content):
    assert split(parser, text, start) == (reasoning, content)


@pytest.mark.parametrize("parser, start, text, reasoning, content", OUTPUTS)
def test_streamed_cut_at_every_position_gives_what_the_whole_output_gives(parser, start, text, reasoning, content):
    for k in range(1, len(text)):
        for cuts in ([k], range(1, k + 1)):
            s, thinking, got = ReasoningStream(parser, start), "", ""
            for end in cuts:
                new, got = s.feed(text[:end])
                thinking += new
            new, got = s.feed(text, final=True)
            assert (thinking + new, got) == (reasoning or "", content), cuts


def run_stream(shape: ChatShape, text: str, finish: str = "stop", step: int = 3) -> list[dict]:
    """The chunks' (delta, finish_reason) as a client reads them."""
    next_chunk = shape.stream()
    p, out = Progress("r", 5), []
    for end in range(step, len(text) + step, step):
        p.text = text[:end]
        if end >= len(text):
            p.finish_reason = finish
        got = next_chunk(p)
        if got is not None:
            body = chat_delta_chunk(p, "id", 0, "m", got[0], got[1], False)
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
    plan = ToolPlan("auto", [{"type": "function", "function": {"name": "w"}}], names=("w",), parser="hermes")
    shape = ChatShape(plan, "hermes", "qwen3")
    msg, finish = shape.message(text, "stop")
    assert finish == "tool_calls" and msg["reasoning_content"] == "Need the weather tool."
    assert msg["tool_calls"][0]["function"]["name"] == "w" and not msg["content"]
    chunks = run_stream(shape, text)
    assert "".join(d.get("content") or "" for d, _ in chunks) == ""
    calls = [c for d, _ in chunks for c in d.get("tool_calls", [])]
    assert calls[0]["function"]["name"] == "w" and "".join(c["function"]["arguments"] for c in calls) == '{"c": 1}'
    assert chunks[-1][1] == "tool_calls"
    assert "".join(d.get("reasoning_content", "") for d, _ in chunks) == "Need the weather tool."


def test_a_shaped_stream_carries_every_tokens_logprobs_with_its_text_or_the_next_chunk():
    """Each call adds one token (its logprobs as take_chat gives them); a call that sends nothing
    (a held tag) keeps them for the next chunk; together they are every token's, in order."""
    tokens = ["<think>", "\nNeed", " it", ".\n", "</", "think", ">\n\n", "Yes", "."]
    shape = ChatShape(None, "none", "qwen3")
    next_chunk, p, sent = shape.stream(), Progress("r", 5), []
    for i, tok in enumerate(tokens):
        p.text += tok
        p.finish_reason = "stop" if i == len(tokens) - 1 else None
        lp = {"content": [{"token": tok, "logprob": -0.5}], "refusal": None}
        got = next_chunk(p, lp)
        if got is not None:
            delta, _finish, logprobs = got
            sent.append((delta, [t["token"] for t in logprobs["content"]]))
    assert [t for _, toks in sent for t in toks] == tokens
    held = next(toks for d, toks in sent if "</" in toks)  # "</" was held: it went with a later chunk
    assert held[0] == "</" and len(held) > 1


def test_a_plain_chat_takes_the_fast_path():
    assert ChatShape(None, "llama3_json", "none").plain and ChatShape(None, "none", "none").message("x", "stop") == (None, None)
