"""Reasoning models: the thinking part of a chat output goes to `reasoning_content` (as vLLM and
SGLang answer), the rest to `content` (and to the tool-call parsers).

    qwen3        <think>...</think> answer. Where the output starts depends on the prompt the template
                 wrote (`start_of`): after a generation prompt the model may open <think> itself (an
                 output that does not is all answer); a template that opens <think> itself (the
                 Qwen3 2507 "Thinking" releases) starts the output inside the thinking; one that
                 closed an empty block (enable_thinking false) leaves no thinking
    deepseek_r1  the template opened <think>: the output starts inside the thinking (a model may
                 still write the opening tag: dropped)

Thinking runs until </think> (all of it while none came). `read(parser, text, start, final)`
gives the reasoning and the content of the output so far, each a prefix of what the whole output
gives (a possible start of a tag and trailing newlines of the thinking are held back): the stream
(`ReasoningStream`) sends the difference, the whole answer (`split`) reads with final=True, so both
give the same text however the output is cut.
"""

from __future__ import annotations

PARSERS = ("qwen3", "deepseek_r1")
FAMILY_PARSER = {"qwen3": "qwen3"}  # model family (engine/families.py) -> its reasoning format
OPEN, CLOSE = "<think>", "</think>"

# where a reasoning model's output starts (`start_of`)
INSIDE = "inside"  # in the thinking: the template opened <think>
MAY_OPEN = "may_open"  # the model may open <think> first
NO_THINKING = "none"  # no reasoning parser, or the template closed the block (thinking off)


def start_of(parser: str, prompt_tail: str) -> str:
    """Where the output starts, from the end of the prompt's text (the template's generation prompt)."""
    if parser not in PARSERS:
        return NO_THINKING
    tail = prompt_tail.rstrip()
    if tail.endswith(CLOSE):
        return NO_THINKING
    if tail.endswith(OPEN) or parser == "deepseek_r1":
        return INSIDE
    return MAY_OPEN


def tag_start_at_end(text: str, tag: str) -> int:
    """Characters at the end of `text` that may be the start of `tag`."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-k:]):
            return k
    return 0


def read(text: str, start: str, final: bool) -> tuple[str | None, str]:
    """(reasoning so far, None when the output does not think; content so far)."""
    if start == NO_THINKING:
        return None, text
    head = text.lstrip()
    if not final and len(head) < len(OPEN) and OPEN.startswith(head):
        return None, ""  # may still become <think>
    if head.startswith(OPEN):
        body = head[len(OPEN):]
    elif start == INSIDE:
        body = text
    else:
        return None, text  # it did not open one: all answer
    end = body.find(CLOSE)
    if end >= 0:
        return body[:end].strip("\n"), body[end + len(CLOSE):].lstrip("\n")
    if not final:
        body = body[:len(body) - tag_start_at_end(body, CLOSE)]
    return body.strip("\n"), ""


def split(parser: str, text: str, start: str | None = None) -> tuple[str | None, str]:
    """(reasoning or None, content) of a whole output; `start`: from `start_of` (default: qwen3's
    output may open <think>, deepseek_r1's starts inside)."""
    reasoning, content = read(text, start or start_of(parser, ""), final=True)
    return reasoning or None, content


class ReasoningStream:
    """The output so far in, (new reasoning text, content so far) out."""

    def __init__(self, parser: str, start: str | None = None):
        self.start = start or start_of(parser, "")
        self.sent = 0  # characters of reasoning already given out

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        reasoning, content = read(text, self.start, final)
        reasoning = reasoning or ""
        new, self.sent = reasoning[self.sent:], max(self.sent, len(reasoning))
        return new, content
