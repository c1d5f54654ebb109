"""A chat output as the client gets it: thinking in `reasoning_content` (router/http/reasoning.py), tool
calls in `tool_calls` (router/http/tools.py forced, router/http/tool_parsers.py written by the model), the
rest in `content`; non-streamed (`message`) and streamed (`ChatStream`). A plain chat (no tools, no
reasoning parser) takes neither: the generation handler's fast path (router/http/generation.py)."""

from __future__ import annotations

from router.http import formats
from router.http.reasoning import ReasoningStream
from router.http.reasoning import split as split_reasoning
from router.http.tool_parsers import AutoToolStream
from router.http.tool_parsers import parse as parse_tool_calls
from router.http.tools import ToolPlan, ToolStream, answer, final_message


class ChatShape:
    """How one request's output is read: its tool plan and the model's parsers ("none": off)."""

    def __init__(self, plan: ToolPlan | None, tool_parser: str, reasoning_parser: str):
        self.plan = plan
        self.forced = plan is not None and plan.grammar is not None  # a tool call under its grammar
        self.parsed = plan is not None and plan.mode == "auto" and tool_parser != "none"  # calls read from text
        self.tool_parser = tool_parser
        # a forced call's output is its grammar's JSON: no thinking in it
        self.reasoning = reasoning_parser if reasoning_parser != "none" and not self.forced else ""

    @property
    def plain(self) -> bool:
        return not (self.forced or self.parsed or self.reasoning)

    def message(self, text: str, finish_reason: str) -> tuple[dict | None, str | None]:
        """(message, finish_reason) of a whole output; (None, None) for a plain one."""
        if self.plain:
            return None, None
        if self.forced:
            return final_message(self.plan, text, finish_reason)
        reasoning, content = split_reasoning(self.reasoning, text) if self.reasoning else (None, text)
        msg, finish = {"role": "assistant", "content": content}, finish_reason
        if self.parsed:
            msg, finish = auto_message(self.tool_parser, content, finish_reason)
        if reasoning is not None:
            msg["reasoning_content"] = reasoning
        return msg, finish

    def stream(self, continuous: bool, index: int = 0):
        """chunk(progress, oid, created, model, delta_text, first, include_usage) -> bytes (b"": nothing
        to send yet) for a chat that is not plain; `index`: the choice it streams (n > 1)."""
        inner = ToolStream(self.plan) if self.forced else AutoToolStream(self.tool_parser) if self.parsed \
            else TextStream()
        thinking = ReasoningStream(self.reasoning) if self.reasoning else None
        role_sent = [False]

        def chunk(p, oid, created, model, delta_text, first, include_usage) -> bytes:
            think, text = "", p.text
            if p.finish_reason:
                if thinking is not None:  # the whole output decides (a think block never closed: all thinking)
                    reasoning, text = split_reasoning(self.reasoning, p.text)
                    think = (reasoning or "")[thinking.sent:]
                delta, finish = inner.finish(text, p.finish_reason)
            else:
                if thinking is not None:
                    think, text = thinking.feed(p.text)
                delta, finish = inner.delta(text) or {}, None
            if think:
                delta = {"reasoning_content": think, **delta}
            if not role_sent[0] and (delta or finish):
                delta, role_sent[0] = {"role": "assistant", **delta}, True
            if not delta and not finish:
                return b""
            return formats.chat_delta_chunk(p, oid, created, model, delta, finish, include_usage, continuous,
                                            index=index)
        return chunk


class TextStream:
    """Plain content, as the other streams take it: the output so far in, its new part out."""

    def __init__(self):
        self.sent = 0

    def delta(self, text: str) -> dict | None:
        new, self.sent = text[self.sent:], max(self.sent, len(text))
        return {"content": new} if new else None

    def finish(self, text: str, finish_reason: str) -> tuple[dict, str]:
        return self.delta(text) or {}, finish_reason


def auto_message(parser: str, text: str, finish_reason: str) -> tuple[dict, str]:
    """A non-streamed answer's message with the calls the model wrote in its own format, if any."""
    content, calls = parse_tool_calls(parser, text) if finish_reason == "stop" else (text, [])
    return answer(text, calls, finish_reason, content)
