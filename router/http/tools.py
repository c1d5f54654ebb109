"""Tool calling on chat requests: the plan (what the template sees, the grammar the output runs
under, how the output is read back) and the messages as chat templates read them.

    tool_choice        the model's output                                   read back by
    absent / "auto"    free text and calls in the family's call format;     the family's parser
                       a tool with strict true: its calls under its schema  (router/http/tool_parsers.py)
    "none"             free text (the tools stay in the prompt)             - (text)
    {"function": f}    f's call in the family's format, under f's schema    the family's parser
    "required"         one call or more in the family's format, nothing     the family's parser
                       else (parallel_tool_calls false: one)
    {"allowed_tools":  as "auto" / "required" with only the listed tools    the family's parser
     {mode, tools}}    callable (a call, once begun, is one of them); every
                       tool stays in the prompt (OpenAI's: the prompt, and
                       its cached prefix, is the same whichever are allowed)

The grammars are structural tags in the family's format (router/http/tool_grammar.py). A model
with no call format (model.tool_call_parser none) refuses "auto" (as vLLM does) and writes forced
calls as bare JSON (router/http/json_calls.py). parallel_tool_calls false with "auto": the first
call only (what vLLM returns; a strict tool's grammar also ends the output after it).
"""

from __future__ import annotations

import json
import secrets
import string
import uuid
from dataclasses import dataclass, field, replace

from proto.pdorch.v1 import worker_pb2
from router.errors import bad_request
from router.http import tool_grammar
from router.http.bodies import AllowedToolsChoice

_ID_CHARS = string.ascii_letters + string.digits


def new_call_id(parser: str = "") -> str:
    """A call's id: 9 letters and digits for Mistral (its v0.3 / Nemo templates refuse any other
    length when the call comes back in the history), "call_" + 24 hex digits otherwise."""
    if parser == "mistral":
        return "".join(secrets.choice(_ID_CHARS) for _ in range(9))
    return "call_" + uuid.uuid4().hex[:24]


@dataclass(frozen=True)
class ToolCallOut:
    name: str
    arguments: str  # JSON text
    id: str = field(default_factory=new_call_id)

    def to_openai(self, index: int | None = None) -> dict:
        out = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return out if index is None else {"index": index, **out}


@dataclass(frozen=True)
class ToolPlan:
    """A chat request's tools: `template_tools` for the chat template; `mode` ("auto", "none",
    "named", "required"); `grammar` for a forced call or strict tools in "auto" (None: free);
    `parser` the call format the output is read in ("none": forced calls as bare JSON)."""

    mode: str
    template_tools: list[dict]
    grammar: worker_pb2.Grammar | None = None
    forced_name: str = ""  # mode "named": the function called
    names: tuple[str, ...] = ()  # the calls the output may make (a call of another name is text)
    parser: str = "none"
    one_call: bool = False  # parallel_tool_calls false
    call_tags: tuple[dict, ...] = ()  # "auto": each tool's call as a structural tag (a structured output's alternative)

    @property
    def forced(self) -> bool:
        return self.mode in ("named", "required")


def tool_plan(req, parser: str = "none") -> ToolPlan | None:
    """None without tools and without tool_choice; 400 for a tool_choice that cannot be served.
    `parser`: the model's call format (RouterService.tool_parser)."""
    tools, choice = req.tools or [], req.tool_choice
    if not tools:
        if choice is None or choice in ("none", "auto"):
            return None
        raise bad_request("tool_choice needs tools: the request lists none", param="tool_choice")
    names = tuple(t.function.name for t in tools)
    if len(set(names)) != len(names):
        raise bad_request(f"tools: function names must be distinct, got {list(names)}", param="tools")
    for t in tools:
        if t.function.parameters is not None and not isinstance(t.function.parameters, dict):
            raise bad_request(f"tools: {t.function.name}'s parameters must be a JSON schema (an object)", param="tools")
    plan = ToolPlan("none", [t.model_dump(exclude_none=True) for t in tools], names=names, parser=parser,
                    one_call=req.parallel_tool_calls is False)
    if choice == "none":
        return plan
    schemas = {t.function.name: t.function.parameters or tool_grammar.NO_ARGUMENTS for t in tools}
    if isinstance(choice, AllowedToolsChoice):  # every tool stays in the prompt; these alone may be called
        tools = _allowed(choice, tools)
        choice = choice.allowed_tools.mode
        plan = replace(plan, names=tuple(t.function.name for t in tools))
    if choice is None or choice == "auto":
        if parser == "none":
            raise bad_request('tool_choice "auto" needs a tool call parser, and this model has none '
                              "(model.tool_call_parser); send tool_choice \"none\", \"required\" or a named "
                              "function", param="tool_choice")
        tags = tuple(tool_grammar.call_tag(parser, t.function.name, schemas[t.function.name] if t.function.strict
                                           else tool_grammar.ANY_OBJECT) for t in tools)
        plan = replace(plan, mode="auto", call_tags=tags)
        # free text: a call, once begun, is one of the callable tools (under its schema if strict)
        if not any(t.function.strict for t in tools) and plan.names == names:
            return plan
        return replace(plan, grammar=tool_grammar.structural_tag(tool_grammar.free_text_format(parser, list(tags),
                                                                                              plan.one_call)))
    if choice == "required":
        if parser == "none":
            return replace(plan, mode="required", grammar=tool_grammar.required_grammar(tools, plan.one_call))
        required = [tool_grammar.call_tag(parser, n, schemas[n]) for n in plan.names]
        return replace(plan, mode="required",
                       grammar=tool_grammar.structural_tag(tool_grammar.calls_format(parser, required, plan.one_call)))
    name = choice.function.name
    if name not in names:
        raise bad_request(f"tool_choice.function.name: no tool named {name!r} (tools: {', '.join(names)})",
                          param="tool_choice.function.name")
    if parser == "none":
        grammar = tool_grammar.named_grammar(schemas[name])
    else:
        grammar = tool_grammar.structural_tag(tool_grammar.calls_format(
            parser, [tool_grammar.call_tag(parser, name, schemas[name])], True))
    return replace(plan, mode="named", grammar=grammar, forced_name=name, names=(name,), one_call=True)


def _allowed(choice: AllowedToolsChoice, tools: list) -> list:
    """The tools `allowed_tools` lets the model call, in the request's order; a name that is not a
    tool is a 400 naming it."""
    by_name = {t.function.name: t for t in tools}
    wanted = [t.function.name for t in choice.allowed_tools.tools]
    for i, name in enumerate(wanted):
        if name not in by_name:
            raise bad_request(f"tool_choice.allowed_tools.tools.{i}.function.name: no tool named {name!r} "
                              f"(tools: {', '.join(by_name)})", param=f"tool_choice.allowed_tools.tools.{i}.function.name")
    return [t for t in tools if t.function.name in wanted]


def template_messages(messages) -> list[dict]:
    """The messages as transformers-style chat templates read them: an assistant turn's tool_calls
    with their arguments as objects (templates write them with `tojson`, as vLLM passes them), a
    tool turn's tool_call_id and name."""
    out = []
    for i, m in enumerate(messages):
        msg = {"role": m.role, "content": m.text()}
        if m.reasoning_content is not None:  # Qwen3's template replays it between the steps of a tool loop
            msg["reasoning_content"] = m.reasoning_content
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


def answer(text: str, calls: list[ToolCallOut] | None, finish_reason: str,
           content: str | None = None) -> tuple[dict, str]:
    """A non-streamed chat message: `text` as content without calls; with them, `content` (the text
    beside the calls, if any) and the calls, finish_reason "tool_calls" for an output that ended
    by itself (one cut at max_tokens stays "length")."""
    if not calls:
        return {"role": "assistant", "content": text}, finish_reason
    return ({"role": "assistant", "content": content, "tool_calls": [c.to_openai() for c in calls]},
            "tool_calls" if finish_reason == "stop" else finish_reason)
