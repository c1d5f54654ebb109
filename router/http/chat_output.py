"""A chat output as the client gets it: thinking in `reasoning_content` (router/http/reasoning.py), tool
calls in `tool_calls` (router/http/tool_parsers.py in the family's format; router/http/json_calls.py
for bare-JSON forced calls), the rest in `content`; non-streamed (`message`) and streamed (`stream`).
A plain chat (no tools, no reasoning parser) takes neither: the generation handler's fast path
(router/http/generation.py).

Streamed logprobs ride with the text: each chunk's tokens' logprobs go out with that chunk, or, when
its text is held back (a possible tag, a call not decided yet), with the next chunk sent; the last
chunk carries whatever is left, so the stream's logprobs are the whole answer's.
"""

from __future__ import annotations

from typing import Protocol

from router.http.json_calls import ToolStream, final_message
from router.http.reasoning import ReasoningStream, start_of
from router.http.reasoning import split as split_reasoning
from router.http.tool_parsers import AutoToolStream
from router.http.tool_parsers import parse as parse_tool_calls
from router.http.tools import ToolPlan, answer


class OutputStream(Protocol):
    """The content of a streamed chat, read as it grows: `TextStream` (plain text), `ToolStream`
    (router/http/json_calls.py: bare-JSON forced calls) and `AutoToolStream` (router/http/tool_parsers.py:
    calls in the family's format). Each takes the whole output so far (after the thinking) and gives
    back only what is new."""

    def delta(self, text: str) -> dict | None:
        """The chunk's delta (`content`, `tool_calls`) of the output so far; None: nothing to send yet."""
        ...

    def finish(self, text: str, finish_reason: str) -> tuple[dict, str]:
        """The last delta (whatever was held back) and the finish reason ("tool_calls" when calls were made)."""
        ...


class ChatShape:
    """How one request's output is read: its tool plan and the model's parsers ("none": off).
    `start`: where a reasoning model's output starts (router/http/reasoning.py start_of, from the
    prompt); None: the parser's default."""

    def __init__(self, plan: ToolPlan | None, tool_parser: str, reasoning_parser: str, start: str | None = None):
        self.plan = plan
        self.json_forced = plan is not None and plan.forced and plan.parser == "none"  # bare JSON calls
        parser = plan.parser if plan is not None and plan.forced else tool_parser
        # calls read in the family's format: "auto", and forced calls its structural tag wrote
        self.calls_parser = parser if plan is not None and plan.mode != "none" and not self.json_forced \
            and parser != "none" else ""
        self.names = plan.names if plan is not None else ()
        self.max_calls = 1 if plan is not None and plan.one_call else None
        self.reasoning = reasoning_parser if reasoning_parser != "none" else ""
        self.start = start or start_of(self.reasoning, "")

    @property
    def plain(self) -> bool:
        return not (self.json_forced or self.calls_parser or self.reasoning)

    def message(self, text: str, finish_reason: str) -> tuple[dict | None, str | None]:
        """(message, finish_reason) of a whole output; (None, None) for a plain one."""
        if self.plain:
            return None, None
        reasoning, content = split_reasoning(self.reasoning, text, self.start) if self.reasoning else (None, text)
        if self.json_forced and self.plan is not None:  # json_forced says there is a plan
            msg, finish = final_message(self.plan, content, finish_reason)
        elif self.calls_parser:
            msg, finish = auto_message(self.calls_parser, content, finish_reason, self.names, self.max_calls)
        else:
            msg, finish = {"role": "assistant", "content": content}, finish_reason
        if reasoning is not None:
            msg["reasoning_content"] = reasoning
        return msg, finish

    def stream(self):
        """step(progress, logprobs=None) -> (delta, finish_reason, logprobs), or None while there is
        nothing to send yet, for a chat that is not plain: what the choice's next chunk carries (the
        handler makes it an SSE chunk: formats.chat_delta_chunk). `logprobs`: the chat logprobs of the
        tokens this call adds (router/http/logprobs.py take_chat); those of a chunk held back go with the next."""
        inner: OutputStream
        if self.json_forced and self.plan is not None:
            inner = ToolStream(self.plan)
        elif self.calls_parser:
            inner = AutoToolStream(self.calls_parser, self.names, self.max_calls)
        else:
            inner = TextStream()
        thinking = ReasoningStream(self.reasoning, self.start) if self.reasoning else None
        role_sent, held = [False], []  # held: logprobs of tokens whose chunk sent nothing yet

        def step(p, logprobs: dict | None = None) -> tuple[dict, str | None, dict | None] | None:
            think, text = thinking.feed(p.text, final=bool(p.finish_reason)) if thinking else ("", p.text)
            if p.finish_reason:
                delta, finish = inner.finish(text, p.finish_reason)
            else:
                delta, finish = inner.delta(text) or {}, None
            if think:
                delta = {"reasoning_content": think, **delta}
            if not role_sent[0] and (delta or finish):
                delta, role_sent[0] = {"role": "assistant", **delta}, True
            if logprobs is not None:
                held.extend(logprobs["content"])
            if not delta and not finish:
                return None
            lps = None
            if logprobs is not None:
                lps = {"content": list(held), "refusal": None}
                held.clear()
            return delta, finish, lps
        return step


class TextStream:
    """Plain content, as the other streams take it: the output so far in, its new part out."""

    def __init__(self):
        self.sent = 0

    def delta(self, text: str) -> dict | None:
        new, self.sent = text[self.sent:], max(self.sent, len(text))
        return {"content": new} if new else None

    def finish(self, text: str, finish_reason: str) -> tuple[dict, str]:
        return self.delta(text) or {}, finish_reason


def auto_message(parser: str, text: str, finish_reason: str, names, max_calls: int | None = None) -> tuple[dict, str]:
    """A non-streamed answer's message with the calls the model wrote in its own format, if any
    (`max_calls` 1: the first only)."""
    content, calls = parse_tool_calls(parser, text, names)
    return answer(text, calls[:max_calls], finish_reason, content)
