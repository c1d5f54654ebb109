"""The router's chat prompts: the model's chat template (or the one `model.chat_template` names, as vLLM's
`--chat-template`), and for a template that ignores tools, the built-in tool template of its chat format
for tool turns (engine/tool_templates.py). Decided once at start; `ChatSetup.describe()` is what the
start log and `pdorch status` say. Torch-free.

A tool turn is a request with tools, or messages with an assistant's tool_calls or a tool result. Plain
chats keep the model's own template (its default system prompt, its exact prefix), tool turns of a
tool-blind template go through the built-in one; with no built-in for its format they are refused (a 400
naming the field), never rendered with the tools left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.chat_template import ChatTemplate, ChatTemplateError
from engine.tool_templates import PLAIN_PROBE, BuiltinTemplate, builtin_for, ignored_by

CHECKPOINT = "checkpoint"  # ChatSetup.source: the template came with the model


@dataclass(frozen=True)
class ChatSetup:
    source: str                               # CHECKPOINT, the model.chat_template path, or "" (none)
    ignored: tuple[str, ...] = ()             # what the template leaves out (tool_templates.ignored_by)
    builtin: BuiltinTemplate | None = None    # renders the tool turns instead

    @property
    def call_format(self) -> str | None:
        """The tool-call parser that reads the calls the built-in writes (None: no built-in in use)."""
        return self.builtin.call_format if self.builtin else None

    def describe(self) -> str:
        if not self.source:
            return "chat template: none (chat requests are refused; use completions)"
        whose = "the checkpoint's" if self.source == CHECKPOINT else f"{self.source} (model.chat_template)"
        if not self.ignored:
            return f"chat template: {whose}; it renders tools, tool calls and tool results"
        lost = " and ".join(self.ignored)
        if self.builtin is None:
            return (f"chat template: {whose}; it ignores {lost} and no built-in tool template fits its format: "
                    "requests with tools are refused (set model.chat_template)")
        return (f"chat template: {whose}; it ignores {lost}, so tool turns use the built-in "
                f"{self.builtin.file} (calls as the {self.builtin.call_format} parser reads them)")

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "ignores": list(self.ignored),
                "tool_template": self.builtin.file if self.builtin else None, "summary": self.describe()}


class ChatPrompts:
    def __init__(self, tokenizer, own: ChatTemplate | None, tools: ChatTemplate | None, setup: ChatSetup):
        self.tokenizer = tokenizer
        self.setup = setup
        self._own, self._tools = own, tools
        self._bos, self._eos = tokenizer.bos_token or "", tokenizer.eos_token or ""

    @classmethod
    def load(cls, tokenizer, template_path: str = "") -> ChatPrompts:
        """`template_path`: model.chat_template (empty: the checkpoint's template). ChatTemplateError when
        that file cannot be read, does not compile or fails to render a one-message chat."""
        if template_path:
            try:
                source = Path(template_path).expanduser().read_text()
            except (OSError, UnicodeDecodeError) as e:
                raise ChatTemplateError(f"cannot read {template_path}: {getattr(e, 'strerror', None) or e}") from None
            own = ChatTemplate(source)
            own.render(PLAIN_PROBE, True, False, tokenizer.bos_token or "", tokenizer.eos_token or "")
        elif tokenizer.chat_template:
            source, own = tokenizer.chat_template, ChatTemplate(tokenizer.chat_template)
        else:
            return cls(tokenizer, None, None, ChatSetup(""))
        ignored = ignored_by(own, tokenizer.bos_token or "", tokenizer.eos_token or "")
        builtin = builtin_for(source) if ignored else None
        setup = ChatSetup(template_path or CHECKPOINT, ignored, builtin)
        return cls(tokenizer, own, ChatTemplate(builtin.source()) if builtin else None, setup)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               continue_final_message: bool = False, **kwargs) -> str:
        """The prompt text; `kwargs`: the template's extra variables (`tools`, chat_template_kwargs)."""
        template = self._template_for(messages, kwargs)
        return template.render(messages, add_generation_prompt, continue_final_message, self._bos, self._eos, **kwargs)

    def encode(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               continue_final_message: bool = False, **kwargs) -> list[int]:
        """Token ids of the prompt (the template holds any BOS: no post-processor, as transformers)."""
        text = self.render(messages, add_generation_prompt, continue_final_message, **kwargs)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _template_for(self, messages: list[dict[str, Any]], kwargs: dict[str, Any]) -> ChatTemplate:
        if self._own is None:
            raise ChatTemplateError("this model has no chat template; use a completion request instead")
        if not self.setup.ignored or not _is_tool_turn(messages, kwargs):
            return self._own
        if self._tools is None:
            raise ChatTemplateError(f"the model's chat template ignores {' and '.join(self.setup.ignored)}, and no "
                                    "built-in tool template fits its format: give the model one that renders them "
                                    "(model.chat_template)", param="tools" if kwargs.get("tools") else "messages")
        return self._tools


def _is_tool_turn(messages: list[dict[str, Any]], kwargs: dict[str, Any]) -> bool:
    return bool(kwargs.get("tools")) or any(m.get("tool_calls") or m.get("role") == "tool" for m in messages)
