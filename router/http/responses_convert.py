"""A Responses request as the chat request the chat pipeline serves (template, tools, grammar, output
shaping: router/http/generation.py), and Responses items as chat messages.

    instructions                      a leading system message (not carried to the next turn, as OpenAI)
    input: "text"                     one user message
    message items                     messages of their role (input_text / output_text parts joined)
    reasoning + message + function_call items in a row
                                      one assistant message: reasoning_content, content, tool_calls
    function_call_output              a tool message (tool_call_id = call_id)
    tools [{type, name, ...}]         tools [{type, function: {name, ...}}]
    tool_choice {type, name}          tool_choice {type, function: {name}}
    text.format                       response_format
    max_output_tokens                 max_completion_tokens

The conversation of a `previous_response_id` chain comes first (router/http/responses_store.py).
"""

from __future__ import annotations

import json

from router.errors import bad_request
from router.http.body_sampling import refuse_unserved
from router.http.responses_request import (
    RESPONSES_REFUSED,
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    ReasoningItem,
    ResponsesRequest,
    input_item,
)

# OpenAI's bounds on metadata: 16 pairs, keys up to 64 characters, values up to 512
_METADATA_PAIRS, _METADATA_KEY, _METADATA_VALUE = 16, 64, 512


def check_served(req: ResponsesRequest) -> None:
    """400 naming the first field set to something not served (the rest of the fields are served)."""
    refuse_unserved(req, RESPONSES_REFUSED)
    if req.reasoning is not None:
        for key in ("effort", "summary", "generate_summary", "context", "mode"):
            if getattr(req.reasoning, key) is not None:
                raise bad_request(f"reasoning.{key} is not supported: a model's thinking is set by its chat "
                                  "template (chat_template_kwargs, e.g. {\"enable_thinking\": false} for Qwen3)",
                                  param=f"reasoning.{key}")
    if req.text is not None and req.text.verbosity not in (None, "medium"):
        raise bad_request(f"text.verbosity={req.text.verbosity!r} is not supported", param="text.verbosity")
    if req.stream_options is not None and req.stream_options.include_obfuscation:
        raise bad_request("stream_options.include_obfuscation: obfuscation padding is not served",
                          param="stream_options.include_obfuscation")
    meta = req.metadata or {}
    if len(meta) > _METADATA_PAIRS or any(len(k) > _METADATA_KEY or len(v) > _METADATA_VALUE for k, v in meta.items()):
        raise bad_request(f"metadata: at most {_METADATA_PAIRS} pairs, keys up to {_METADATA_KEY} characters, "
                          f"values up to {_METADATA_VALUE}", param="metadata")


def input_messages(req: ResponsesRequest) -> list[dict]:
    """This turn's input as chat messages (without `instructions`)."""
    if isinstance(req.input, str):
        return [{"role": "user", "content": req.input}]
    return item_messages([input_item(item, f"input.{i}") for i, item in enumerate(req.input)], "input")


def item_messages(items: list, param: str) -> list[dict]:
    """Validated items (responses_request.py) as chat messages: consecutive reasoning, assistant
    message and function_call items are one assistant turn, as the chat endpoint answered it."""
    out: list[dict] = []
    turn: dict | None = None  # the assistant turn being put together

    def assistant() -> dict:
        nonlocal turn
        if turn is None:
            turn = {"role": "assistant", "content": None}
            out.append(turn)
        return turn

    for i, item in enumerate(items):
        where = f"{param}.{i}"
        if isinstance(item, MessageItem) and item.role == "assistant":
            if turn is not None and (turn.get("tool_calls") or turn["content"] is not None):
                turn = None  # text after calls (or a second text) is a turn of its own
            assistant()["content"] = item.text(where)
        elif isinstance(item, FunctionCallItem):
            try:
                json.loads(item.arguments or "{}")
            except ValueError:
                raise bad_request(f"{where}.arguments is not valid JSON", param=f"{where}.arguments") from None
            call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
            assistant().setdefault("tool_calls", []).append(call)
        elif isinstance(item, ReasoningItem):
            if turn is not None:
                turn = None  # thinking starts the next assistant turn
            text = "".join(part.text for part in item.content or [])
            assistant()["reasoning_content"] = text
        elif isinstance(item, FunctionCallOutputItem):
            turn = None
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text(where)})
        else:  # a user / system / developer message
            turn = None
            out.append({"role": item.role, "content": item.text(where)})
    return out


def chat_body(req: ResponsesRequest, messages: list[dict], session: str) -> dict:
    """The chat request (as a parsed JSON body) that serves `req` over `messages` (the whole
    conversation, instructions first); `session` is its prompt_cache_key (the routing session)."""
    body: dict = {"messages": messages, "stream": req.stream, "prompt_cache_key": session}
    if req.max_output_tokens is not None:
        body["max_completion_tokens"] = req.max_output_tokens
    for name in ("temperature", "top_p", "parallel_tool_calls", "chat_template_kwargs", "user", "safety_identifier"):
        value = getattr(req, name)
        if value is not None:
            body[name] = value
    if req.tools:
        body["tools"] = [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
                         for t in req.tools]
    choice = req.tool_choice
    if choice is not None:
        body["tool_choice"] = choice if isinstance(choice, str) else {"type": "function",
                                                                       "function": {"name": choice.name}}
    fmt = req.text.format if req.text is not None else None
    if fmt is not None and fmt.type == "json_schema":
        spec: dict = {"name": fmt.name, "schema": fmt.schema_}
        if fmt.strict is not None:
            spec["strict"] = fmt.strict
        body["response_format"] = {"type": "json_schema", "json_schema": spec}
    elif fmt is not None:
        body["response_format"] = {"type": fmt.type}
    return body


def conversation(req: ResponsesRequest, history: list[dict], new: list[dict]) -> list[dict]:
    """Instructions, the chain's earlier turns, this turn's input."""
    lead = [{"role": "system", "content": req.instructions}] if req.instructions else []
    return lead + history + new


# A chat-side error names a chat field; the client sent the Responses one.
_PARAMS = (("messages", "input"), ("prompt", "input"), ("max_completion_tokens", "max_output_tokens"),
           ("max_tokens", "max_output_tokens"), ("response_format.json_schema.schema", "text.format.schema"),
           ("response_format", "text.format"), ("tool_choice.function.name", "tool_choice.name"))


def responses_param(err):
    """`err` (an APIError from the chat pipeline) naming the Responses field instead of the chat one."""
    param = err.param or ""
    for chat, ours in _PARAMS:
        if param == chat or param.startswith(chat + "."):
            err.param = ours + param[len(chat):]
            err.message = err.message.replace(chat, ours, 1)
            break
    return err
