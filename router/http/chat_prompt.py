"""A chat request's prompt ids: the body's template fields checked (vLLM's `continue_final_message` and
`chat_template`, `add_generation_prompt`), then the messages rendered by the router's chat templates
(engine/chat_prompts.py). Shared by /v1/chat/completions and /tokenize, so both count the same tokens.

A `chat_template` in the request is refused: a template is a program, and the router would run it on the
event loop that serves every request (jinja's sandbox bounds what it may touch, not how long it runs).
vLLM refuses it too unless started with --trust-request-chat-template. The model's template is set by
the operator: model.chat_template.
"""

from __future__ import annotations

from router.errors import bad_request
from router.http.tools import template_messages


def chat_prompt_ids(svc, req, template_kwargs: dict) -> list[int]:
    """`svc`: the RouterService; `req`: a body with messages and the template fields; `template_kwargs`:
    the template's extra variables (chat_template_kwargs, tools)."""
    check_template_fields(req)
    return svc.encode_chat(template_messages(req.messages), req.add_generation_prompt, req.continue_final_message,
                           **template_kwargs)


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
