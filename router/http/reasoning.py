"""Reasoning models: the thinking part of a chat output goes to `reasoning_content` (as vLLM and
SGLang answer), the rest to `content` (and to the tool-call parsers).

    qwen3        "<think>...</think>answer": an output that begins with <think> is thinking until
                 </think> (all of it while none came); one that does not is all answer
                 (Qwen3 with enable_thinking false: the template already closed an empty think block)
    deepseek_r1  the template opened <think>: thinking until </think>, all of it while none came

split(text) -> (reasoning or None, content). Streamed, `ReasoningStream.feed(text so far)` gives
the new reasoning and the content so far; a possible start of a tag is held back.
"""

from __future__ import annotations

PARSERS = ("qwen3", "deepseek_r1")
FAMILY_PARSER = {"qwen3": "qwen3"}  # model family (engine/families.py) -> its reasoning format
OPEN, CLOSE = "<think>", "</think>"


def split(parser: str, text: str) -> tuple[str | None, str]:
    """(reasoning, content) of a whole output; reasoning None when the output has none."""
    body = text
    if parser == "qwen3":
        stripped = text.lstrip()
        if not stripped.startswith(OPEN):
            return None, text
        body = stripped[len(OPEN):]
    elif body.lstrip().startswith(OPEN):  # deepseek_r1: a model may still write the opening tag
        body = body.lstrip()[len(OPEN):]
    end = body.find(CLOSE)
    if end < 0:
        return body.strip("\n") or None, ""
    return body[:end].strip("\n") or None, body[end + len(CLOSE):].lstrip("\n")


def tag_start_at_end(text: str, tag: str) -> int:
    """Characters at the end of `text` that may be the start of `tag`."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-k:]):
            return k
    return 0


class ReasoningStream:
    """The output so far in, (new reasoning text, content so far) out."""

    def __init__(self, parser: str):
        self.parser = parser
        self.sent = 0  # characters of reasoning already given out

    def feed(self, text: str) -> tuple[str, str]:
        stripped = text.lstrip()
        if self.parser == "qwen3" and len(stripped) < len(OPEN) and OPEN.startswith(stripped):
            return "", ""  # may still become "<think>": wait
        reasoning, content = split(self.parser, text)
        if reasoning is None and CLOSE not in text and self.parser == "qwen3":
            return "", content  # no thinking: all content
        if CLOSE not in text:  # still thinking: hold a possible start of </think>
            body = text.lstrip()
            body = body.removeprefix(OPEN)
            body = body.lstrip("\n")
            visible = body[:len(body) - tag_start_at_end(body, CLOSE)]
            new, self.sent = visible[self.sent:], max(self.sent, len(visible))
            return new, ""
        reasoning = reasoning or ""
        new, self.sent = reasoning[self.sent:], max(self.sent, len(reasoning))
        return new, content
