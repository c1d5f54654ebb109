"""One chat template, compiled and rendered as transformers' `apply_chat_template` renders it (the same
sandboxed jinja2 environment, filters and globals), so a prompt's token ids equal transformers'. Torch-free.

`continue_final_message` (vLLM's and transformers' option) leaves the last message open: the prompt
ends where that message's text ends, so the model continues it instead of starting a new turn.
"""

from __future__ import annotations

import datetime
import json
from typing import Any, ClassVar

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

# What transformers appends to the final message to find where it ends in the rendered prompt.
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


class ChatTemplateError(ValueError):
    """The chat template refused the messages (e.g. roles not alternating), does not compile, or is
    missing. `param`: the request field to name in the 400 (None: `messages`)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def _raise_exception(message: str):
    raise ChatTemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # transformers' own: jinja's built-in tojson escapes HTML characters
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: transformers marks the assistant's tokens with it (for
    training masks); in a prompt it renders its body as it is."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller) -> str:
        return caller()


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env


class ChatTemplate:
    def __init__(self, source: str):
        """`source`: the template's jinja text; ChatTemplateError when it does not compile."""
        self.source = source
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"the chat template does not compile: {e}") from None

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               continue_final_message: bool = False, bos_token: str = "", eos_token: str = "", **kwargs) -> str:
        """The prompt text. `kwargs`: the template's extra variables (`tools`, `enable_thinking`, ...);
        `tools` and `documents` are always defined (None when not given), as transformers defines them."""
        kwargs.setdefault("tools", None)
        kwargs.setdefault("documents", None)
        final = None
        if continue_final_message:
            messages, final = self._tag_final(messages)
        try:
            text = self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         bos_token=bos_token, eos_token=eos_token, **kwargs)
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"chat template failed: {e}") from None
        return text if final is None else _cut_at_tag(text, final)

    def _tag_final(self, messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
        """The messages with the tag after the final message's text, and that text (transformers' way)."""
        if not messages or not isinstance(messages[-1].get("content"), str):
            raise ChatTemplateError("continue_final_message: the final message has no text content to continue",
                                    param="continue_final_message")
        if "content" not in self.source:
            raise ChatTemplateError("continue_final_message: the chat template does not read a message's content",
                                    param="continue_final_message")
        final = messages[-1]["content"]
        return [*messages[:-1], {**messages[-1], "content": final + _CONTINUE_TAG}], final


def _cut_at_tag(text: str, final: str) -> str:
    if final.strip() not in text or _CONTINUE_TAG.strip() not in text:
        raise ChatTemplateError("continue_final_message: the chat template does not render the final message as "
                                "it is, so it cannot be continued", param="continue_final_message")
    at = text.rindex(_CONTINUE_TAG.strip())
    if text[at:at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return text[:at]
    return text[:at].rstrip()  # the template trimmed the message's trailing space
