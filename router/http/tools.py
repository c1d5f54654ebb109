"""Tool calling on chat requests: what the template sees, the grammar a forced call runs under, and
the tool calls read back from the output.

    tool_choice        the model's output                          read back as
    absent / "auto"    free text, the family's call format          router/http/tool_parsers.py (no call: text)
    "none"             free text (the tools stay in the prompt)     text
    {"function": f}    f's arguments, under f's parameters schema   one call of f
    "required"         [{"name": ..., "parameters": {...}}, ...]    the calls, in order
                       under a schema built from every tool's (vLLM's construction), so the
                       arguments always fit; parallel_tool_calls=false: exactly one

A forced call's finish_reason is "tool_calls" (the output ended where its grammar did); one cut at
max_tokens stays "length" and its partial JSON is returned as content, as vLLM does.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from proto.pdorch.v1 import worker_pb2
from router.errors import bad_request

_NO_ARGUMENTS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolCallOut:
    name: str
    arguments: str  # JSON text
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])

    def to_openai(self, index: int | None = None) -> dict:
        out = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return out if index is None else {"index": index, **out}


@dataclass(frozen=True)
class ToolPlan:
    """A chat request's tools: `template_tools` for the chat template, `grammar` when a call is
    forced, `mode` ("auto", "none", "named", "required") says how the output is read back."""

    mode: str
    template_tools: list[dict]
    grammar: worker_pb2.Grammar | None = None
    forced_name: str = ""  # mode "named": the function called

    def calls(self, text: str) -> list[ToolCallOut] | None:
        """The forced call(s) in a finished output; None when it is not a complete call (cut short)."""
        try:
            value = json.loads(text)
        except ValueError:
            return None
        if self.mode == "named":
            return [ToolCallOut(self.forced_name, json.dumps(value, ensure_ascii=False))] if isinstance(value, dict) else None
        if self.mode == "required" and isinstance(value, list) and value:
            return [ToolCallOut(c["name"], json.dumps(c.get("parameters", {}), ensure_ascii=False)) for c in value]
        return None


def tool_plan(req) -> ToolPlan | None:
    """None without tools and without tool_choice; 400 for a tool_choice that cannot be served."""
    tools, choice = req.tools or [], req.tool_choice
    if not tools:
        if choice is None or choice in ("none", "auto"):
            return None
        raise bad_request("tool_choice needs tools: the request lists none", param="tool_choice")
    names = [t.function.name for t in tools]
    if len(set(names)) != len(names):
        raise bad_request(f"tools: function names must be distinct, got {names}", param="tools")
    template_tools = [t.model_dump(exclude_none=True) for t in tools]
    if choice is None or choice == "auto":
        return ToolPlan("auto", template_tools)
    if choice == "none":
        return ToolPlan("none", template_tools)
    if choice == "required":
        one = req.parallel_tool_calls is False
        return ToolPlan("required", template_tools, _grammar(_required_schema(tools, one)))
    name = choice.function.name
    if name not in names:
        raise bad_request(f"tool_choice.function.name: no tool named {name!r} (tools: {', '.join(names)})",
                          param="tool_choice.function.name")
    fn = tools[names.index(name)].function
    return ToolPlan("named", template_tools, _grammar(fn.parameters or _NO_ARGUMENTS), forced_name=name)


_DEFS_KEYS = ("$defs", "definitions")  # where JSON schemas keep the definitions "#/$defs/X" points at


def _required_schema(tools, exactly_one: bool) -> dict:
    """Every tool's call in one array schema; the tools' definitions hoisted to its root (below)."""
    params, defs = hoisted_definitions([(t.function.name, t.function.parameters or _NO_ARGUMENTS) for t in tools])
    call = [{"type": "object", "properties": {"name": {"type": "string", "enum": [t.function.name]},
                                              "parameters": p},
             "required": ["name", "parameters"]} for t, p in zip(tools, params)]
    schema = {"type": "array", "minItems": 1, "items": call[0] if len(call) == 1 else {"anyOf": call}}
    if exactly_one:
        schema["maxItems"] = 1
    return {**schema, **defs}


def hoisted_definitions(schemas: list[tuple[str, dict]]) -> tuple[list[dict], dict]:
    """(each tool's schema without its definitions, the definitions for the combined schema's root).

    A tool's `$ref: "#/$defs/Address"` points at its own root; copied into a combined schema it must
    find `$defs` at the combined root, so the definitions move there (vLLM's get_tool_schema_defs;
    pydantic puts every nested model in `$defs`). One name defined differently by two tools cannot
    be hoisted: 400 naming both."""
    out, defs, owner = [], {}, {}
    for name, schema in schemas:
        if not isinstance(schema, dict):
            raise bad_request(f"tools: {name}'s parameters must be a JSON schema (an object)", param="tools")
        schema = dict(schema)
        for key in _DEFS_KEYS:
            mine = schema.pop(key, None) or {}
            if not isinstance(mine, dict):
                raise bad_request(f"tools: {name}'s parameters.{key} must be an object", param="tools")
            for def_name, body in mine.items():
                seen = defs.setdefault(key, {})
                if def_name in seen and seen[def_name] != body:
                    raise bad_request(f"tools: {owner[key, def_name]!r} and {name!r} define {key}/{def_name} "
                                      "differently; one request's forced-call grammar holds one definition per name",
                                      param="tools")
                seen[def_name], owner[key, def_name] = body, owner.get((key, def_name), name)
        out.append(schema)
    return out, defs


def _grammar(schema: dict) -> worker_pb2.Grammar:
    if not isinstance(schema, dict):
        raise bad_request("tools: a function's parameters must be a JSON schema (an object)", param="tools")
    return worker_pb2.Grammar(kind="json_schema", spec=json.dumps(schema))


def template_messages(messages) -> list[dict]:
    """The messages as transformers-style chat templates read them: an assistant turn's tool_calls
    with their arguments as objects (templates write them with `tojson`, as vLLM passes them), a
    tool turn's tool_call_id and name."""
    out = []
    for i, m in enumerate(messages):
        msg = {"role": m.role, "content": m.text()}
        if m.name is not None:
            msg["name"] = m.name
        if m.tool_call_id is not None:
            msg["tool_call_id"] = m.tool_call_id
        if m.tool_calls:
            calls = []
            for j, c in enumerate(m.tool_calls):
                try:
                    args = json.loads(c.function.arguments) if c.function.arguments else {}
                except ValueError:
                    raise bad_request(f"messages.{i}.tool_calls.{j}.function.arguments is not valid JSON",
                                      param=f"messages.{i}.tool_calls.{j}.function.arguments") from None
                calls.append({"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": args}})
            msg["tool_calls"] = calls
        out.append(msg)
    return out


class ToolStream:
    """A forced call's output as OpenAI chat deltas. "named": the arguments stream as they come (the
    first piece opens the call with its id and name); "required": held until the end (the calls are
    known once the JSON array closes), then sent in one chunk."""

    def __init__(self, plan: ToolPlan):
        self.plan = plan
        self.call_id = ToolCallOut("", "").id
        self.sent_role = self.opened = False
        self.sent = 0  # characters of the output already sent as arguments

    def delta(self, output: str) -> dict | None:
        """The delta for the output so far (all of it), or None (nothing to send yet)."""
        text, self.sent = output[self.sent:], len(output)
        out: dict = {}
        if not self.sent_role:
            out["role"], self.sent_role = "assistant", True
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
        calls = self.plan.calls(text) if finish_reason == "stop" else None
        if self.plan.mode == "named":
            return self.delta(text) or {}, "tool_calls" if calls else finish_reason
        out = {} if self.sent_role else {"role": "assistant"}
        self.sent_role = True
        if calls:
            out["tool_calls"] = [c.to_openai(i) for i, c in enumerate(calls)]
            return out, "tool_calls"
        out["content"] = text  # cut short: the partial JSON as text, as vLLM does
        return out, finish_reason


def final_message(plan: ToolPlan, text: str, finish_reason: str) -> tuple[dict, str]:
    """A non-streamed answer's message and finish_reason for a forced call."""
    return answer(text, plan.calls(text) if finish_reason == "stop" else None, finish_reason)


def answer(text: str, calls: list[ToolCallOut] | None, finish_reason: str,
           content: str | None = None) -> tuple[dict, str]:
    """A non-streamed chat message: `text` as content without calls; with them, `content` (the text
    beside the calls, if any) and the calls, finish_reason "tool_calls"."""
    if not calls:
        return {"role": "assistant", "content": text}, finish_reason
    return {"role": "assistant", "content": content, "tool_calls": [c.to_openai() for c in calls]}, "tool_calls"
