"""The router's chat prompts. At start: the chat templates it renders with (engine/chat_prompts.py; a
bad model.chat_template is a configuration error) and what `pdorch status` says of them. Per request: the
body's template fields checked (vLLM's `continue_final_message` and `chat_template`,
`add_generation_prompt`), then the messages rendered; shared by /v1/chat/completions and /tokenize, so
both count the same tokens.

A `chat_template` in the request is refused: a template is a program, and the router would run it on the
event loop that serves every request (jinja's sandbox bounds what it may touch, not how long it runs).
vLLM refuses it too unless started with --trust-request-chat-template. The model's template is set by
the operator: model.chat_template.
"""

from __future__ import annotations

import logging

from engine.chat_prompts import ChatPrompts
from engine.chat_template import ChatTemplateError
from pdorch.config import ModelConfig
from router.errors import bad_request
from router.http.tools import template_messages

log = logging.getLogger(__name__)


def chat_prompts(tokenizer, model: ModelConfig) -> ChatPrompts:
    """The chat templates the router renders with (engine/chat_prompts.py); a model.chat_template that
    cannot be read, compiled or rendered is a ConfigError naming the key."""
    from pdorch.config_loader import ConfigError

    try:
        chat = ChatPrompts.load(tokenizer, model.chat_template)
    except ChatTemplateError as e:
        if model.chat_template:
            raise ConfigError(f"model.chat_template: {e}") from None
        raise ConfigError(f"model.source: the model's own chat template: {e}; give one that works with "
                          "model.chat_template") from None
    log.info("%s", chat.setup.describe())
    return chat


def chat_status(chat: ChatPrompts, tool_parser: str) -> dict:
    """What `pdorch status` says of the chat template (the admin /workers body). A tool_call_parser set
    to another format than the built-in tool template writes is warned of: a tool loop would not
    round-trip (the calls in the history are in one format, the parser reads another)."""
    out = {**chat.setup.to_json(), "tool_call_parser": tool_parser}
    fmt = chat.setup.call_format
    if fmt is not None and tool_parser not in (fmt, "none"):
        out["warning"] = (f"model.tool_call_parser is {tool_parser} but the built-in tool template writes calls for "
                          f"{fmt}: calls the model writes in its history's format are not read back")
        log.warning("%s", out["warning"])
    return out


def chat_prompt_ids(chat: ChatPrompts, req, template_kwargs: dict) -> list[int]:
    """The prompt's token ids, rendered by `chat` (the RouterService's); `req`: a body with messages and
    the template fields; `template_kwargs`: the template's extra variables (chat_template_kwargs, tools).
    A template that refuses the messages is a 400 naming the field."""
    check_template_fields(req)
    try:
        return chat.encode(template_messages(req.messages), req.add_generation_prompt, req.continue_final_message,
                           **template_kwargs)
    except ChatTemplateError as e:
        raise bad_request(str(e), param=e.param or "messages") from None


def check_template_fields(req) -> None:
    if req.chat_template is not None:
        raise bad_request("chat_template: a chat template in the request is not run (a template is a program the "
                          "router would run for every client; vLLM refuses it too unless "
                          "--trust-request-chat-template); the operator sets the model's: model.chat_template",
                          param="chat_template")
    if "chat_template" in (req.chat_template_kwargs or {}):
        raise bad_request("chat_template_kwargs may not set chat_template: a chat template in the request is not run; "
                          "the operator sets the model's: model.chat_template", param="chat_template_kwargs")
    if req.continue_final_message and req.add_generation_prompt:
        raise bad_request("continue_final_message and add_generation_prompt cannot both be true (the prompt either "
                          "continues the last message or opens a new one): set add_generation_prompt to false",
                          param="continue_final_message")
