"""Forced tool calls for a model with no call format (model.tool_call_parser none), read back: the
output is bare JSON under a schema of vLLM's construction (router/http/tool_grammar.py).

    tool_choice        the output                                     read back as
    {"function": f}    f's arguments, under f's parameters schema     one call of f
    "required"         [{"name": ..., "parameters": {...}}, ...]      the calls, in order
                       under a schema built from every tool's, so the arguments always fit;
                       parallel_tool_calls=false: exactly one

A model with a call format writes forced calls in it instead (router/http/tool_grammar.py). A forced
call's finish_reason is "tool_calls" (the output ended where its grammar did); one cut at max_tokens
stays "length" and its partial JSON is returned as content, as vLLM does.
"""

from __future__ import annotations

import json

from router.http.tools import ToolCallOut, ToolPlan, answer


def json_calls(plan: ToolPlan, text: str) -> list[ToolCallOut] | None:
    """The forced call(s) in a finished output; None when it is not a complete call (cut short)."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if plan.mode == "named":
        return [ToolCallOut(plan.forced_name, json.dumps(value, ensure_ascii=False))] if isinstance(value, dict) else None
    if plan.mode == "required" and isinstance(value, list) and value:
        return [ToolCallOut(c["name"], json.dumps(c.get("parameters", {}), ensure_ascii=False)) for c in value]
    return None


class ToolStream:
    """A forced call's output as OpenAI chat deltas. "named": the arguments stream as they come (the
    first piece opens the call with its id and name); "required": held until the end (the calls are
    known once the JSON array closes), then sent in one chunk."""

    def __init__(self, plan: ToolPlan):
        self.plan = plan
        self.call_id = ToolCallOut("", "").id
        self.opened = False
        self.sent = 0  # characters of the output already sent as arguments

    def delta(self, output: str) -> dict | None:
        """The delta for the output so far (all of it), or None (nothing to send yet)."""
        text, self.sent = output[self.sent:], len(output)
        out: dict = {}
        if self.plan.mode == "named" and text:
            if self.opened:
                call = {"index": 0, "function": {"arguments": text}}
            else:
                call = {"index": 0, "id": self.call_id, "type": "function",
                        "function": {"name": self.plan.forced_name, "arguments": text}}
                self.opened = True
            out["tool_calls"] = [call]
        return out or None

    def finish(self, text: str, finish_reason: str) -> tuple[dict, str]:
        """The last chunk's delta and its finish_reason; `text`: the whole output."""
        calls = json_calls(self.plan, text) if finish_reason == "stop" else None
        if self.plan.mode == "named":
            return self.delta(text) or {}, "tool_calls" if calls else finish_reason
        out: dict = {}
        if calls:
            out["tool_calls"] = [c.to_openai(i) for i, c in enumerate(calls)]
            return out, "tool_calls"
        out["content"] = text  # cut short: the partial JSON as text, as vLLM does
        return out, finish_reason


def final_message(plan: ToolPlan, text: str, finish_reason: str) -> tuple[dict, str]:
    """A non-streamed answer's message and finish_reason for a forced call."""
    return answer(text, json_calls(plan, text) if finish_reason == "stop" else None, finish_reason)
