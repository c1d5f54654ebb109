"""Chat templates that ignore tools, and the built-in tool templates that stand in for them. Torch-free.

A probe conversation goes through a template once, at start: a tool definition, an assistant turn that
calls a tool and the tool's result, each carrying a marker. What the rendering lacks, the template
ignores (SmolLM2's writes each message's content only: the tool definitions and the call vanish). Tool
turns of such a model are rendered by the built-in template of its chat format, recognised by the
format's marker in the template, and shipped in the package (engine/chat_templates/):

    format   marker in the template   built-in              calls written as, read back by
    chatml   <|im_start|>             chatml_hermes.jinja   <tool_call>{"name", "arguments"}</tool_call>  hermes
    llama3   <|start_header_id|>      llama3_json.jinja     {"name", "parameters"}                        llama3_json
    mistral  [INST]                   mistral.jinja         [TOOL_CALLS] [{"name", "arguments"}]          mistral

Each built-in writes calls in the format its tool-call parser reads (router/http/tool_parsers.py), so
a tool loop round-trips: the call the model wrote comes back in the next prompt as it wrote it.
"""

from __future__ import annotations

import importlib.resources
from dataclasses import dataclass

from engine.chat_template import ChatTemplate, ChatTemplateError

TOOLS, CALLS, RESULTS = "tools", "tool calls", "tool results"


@dataclass(frozen=True)
class BuiltinTemplate:
    format: str        # the chat format it renders
    marker: str        # what in a template says it is of this format
    file: str          # in engine/chat_templates/
    call_format: str   # the tool-call parser that reads the calls it writes

    def source(self) -> str:
        return importlib.resources.files("engine").joinpath("chat_templates", self.file).read_text()


# NOTE: Llama 3 first: its templates may mention other formats' tokens in comments, never the reverse.
BUILTINS = (BuiltinTemplate("llama3", "<|start_header_id|>", "llama3_json.jinja", "llama3_json"),
            BuiltinTemplate("chatml", "<|im_start|>", "chatml_hermes.jinja", "hermes"),
            BuiltinTemplate("mistral", "[INST]", "mistral.jinja", "mistral"))


def builtin_for(template_source: str) -> BuiltinTemplate | None:
    """The built-in tool template of the template's chat format; None when no format's marker is in it."""
    return next((b for b in BUILTINS if b.marker in template_source), None)


# The probe: markers no template writes by itself. The call id has 9 alphanumerics, as Mistral's
# templates require.
_TOOL_NAME, _CALL_NAME, _RESULT = "probe_tool_q7x", "probe_call_k2w", "probe_result_m5z"
_PROBE_TOOLS = [{"type": "function", "function": {
    "name": _TOOL_NAME, "description": "Probe.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
_PROBE_TURNS = [
    {"role": "user", "content": "What is the weather in Oslo?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "probe0001", "type": "function", "function": {"name": _CALL_NAME, "arguments": {"city": "Oslo"}}}]},
    {"role": "tool", "content": _RESULT, "tool_call_id": "probe0001"},
]
PLAIN_PROBE = [{"role": "user", "content": "Hello"}]


def ignored_by(template: ChatTemplate, bos_token: str, eos_token: str) -> tuple[str, ...]:
    """What of tools, tool calls and tool results the template leaves out of a prompt (a template that
    refuses them, e.g. one that allows only alternating user and assistant roles, leaves them out too)."""
    def rendered(messages: list[dict], **kwargs) -> str:
        try:
            return template.render(messages, True, False, bos_token, eos_token, **kwargs)
        except ChatTemplateError:
            return ""

    with_tools = rendered(PLAIN_PROBE, tools=_PROBE_TOOLS)
    turns = rendered(_PROBE_TURNS, tools=_PROBE_TOOLS)
    missing = {TOOLS: _TOOL_NAME not in with_tools, CALLS: _CALL_NAME not in turns, RESULTS: _RESULT not in turns}
    return tuple(what for what, lost in missing.items() if lost)
