"""The body of `POST /v1/responses` (OpenAI's Responses API) and its input items, validated as the chat
bodies are (router/http/bodies.py: strict types, unknown fields ignored, a 400 naming the field).

Every field of the `openai` SDK's ResponseCreateParams is here: honoured (converted to a chat request,
router/http/responses_convert.py) or refused by name when set to something pdorch would not do
(`RESPONSES_REFUSED`). `input` items are validated one by one (`input_item`), so an error names the
item: `input.3.call_id`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from router.errors import bad_request
from router.http.bodies import explain

_CFG = ConfigDict(strict=True, extra="ignore")
_EXACT = ConfigDict(strict=True, extra="forbid")  # a key we do not know here would change what a tool is


class FunctionTool(BaseModel):
    """A function tool in the Responses shape: name, description, parameters, strict at the top level."""
    model_config = _EXACT
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class FunctionChoice(BaseModel):
    model_config = _CFG
    type: Literal["function"]
    name: str


class TextFormat(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"]
    name: str = "response"
    description: str | None = None
    schema_: dict | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(BaseModel):
    model_config = _CFG
    format: TextFormat | None = None
    verbosity: Any = None  # refused when set (responses_convert.py)


class ReasoningConfig(BaseModel):
    """`reasoning`: every key refused when set (a model's thinking is its chat template's:
    `chat_template_kwargs`, e.g. Qwen3's enable_thinking)."""
    model_config = _CFG
    effort: Any = None
    summary: Any = None
    generate_summary: Any = None
    context: Any = None
    mode: Any = None


class StreamOptions(BaseModel):
    model_config = _CFG
    include_obfuscation: bool | None = None  # true refused: no obfuscation padding on the deltas


class ResponsesRequest(BaseModel):
    model_config = _CFG
    model: str | None = None
    input: str | list[dict] = Field(min_length=1)
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    store: bool = True
    previous_response_id: str | None = Field(default=None, min_length=1)
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None  # the session key (prefill-worker affinity); else the chain's first id
    truncation: Literal["auto", "disabled"] | None = None
    chat_template_kwargs: dict | None = None  # as on chat: extra template variables (vLLM's extension)
    # refused when set to anything but what pdorch does anyway (RESPONSES_REFUSED)
    include: list | None = None
    top_logprobs: int | None = None
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None
    max_tool_calls: Any = None
    service_tier: Any = None
    prompt_cache_retention: Any = None
    prompt_cache_options: Any = None
    context_management: Any = None
    moderation: Any = None
    access_programs: Any = None
    background_options: Any = None
    image: Any = None


# name -> (the values served, why): a 400 naming the field otherwise (body_sampling.refuse_unserved)
RESPONSES_REFUSED: dict[str, tuple[tuple, str]] = {
    "truncation": ((None, "disabled"), "a conversation longer than the context is a 400, never cut"),
    "include": ((None, []), "no extra output data is served (logprobs, encrypted reasoning, tool sources)"),
    "top_logprobs": ((None, 0), "logprobs are not served on /v1/responses yet: use /v1/chat/completions"),
    "background": ((None, False), "background responses are not served"),
    "conversation": ((None,), "the Conversations API is not served: use previous_response_id"),
    "prompt": ((None,), "stored prompt templates are not served: send input and instructions"),
    "max_tool_calls": ((None,), "built-in tools are not served"),
    "service_tier": ((None, "auto", "default"), "only the default tier is served"),
    "prompt_cache_retention": ((None,), "the KV cache's retention is the operator's (docs/workers.md)"),
    "prompt_cache_options": ((None,), "the KV cache's retention is the operator's (docs/workers.md)"),
    "context_management": ((None, []), "context compaction is not served"),
    "moderation": ((None,), "moderation is not served"),
    "access_programs": ((None,), "not served"),
    "background_options": ((None,), "background responses are not served"),
    "image": ((None,), "this server serves text only"),
}


# ---------------------------------------------------------------------------------- input items
class ContentPart(BaseModel):
    model_config = _CFG
    type: str
    text: str | None = None
    refusal: str | None = None

    def plain(self, param: str) -> str:
        if self.type in ("input_text", "output_text") and self.text is not None:
            return self.text
        if self.type == "refusal" and self.refusal is not None:
            return self.refusal
        raise bad_request(f"{param}: {self.type!r} content is not served (text only: input_text, output_text)",
                          param=param)


def _text(content: str | list[ContentPart], param: str) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.plain(f"{param}.{i}") for i, part in enumerate(content))


class MessageItem(BaseModel):
    """A message (EasyInputMessage, an input Message, or an earlier output message)."""
    model_config = _CFG
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[ContentPart]

    def text(self, param: str) -> str:
        return _text(self.content, param + ".content")


class FunctionCallItem(BaseModel):
    model_config = _CFG
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str


class FunctionCallOutputItem(BaseModel):
    model_config = _CFG
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[ContentPart]

    def text(self, param: str) -> str:
        return _text(self.output, param + ".output")


class ReasoningText(BaseModel):
    model_config = _CFG
    type: Literal["reasoning_text"]
    text: str


class ReasoningItem(BaseModel):
    """An earlier response's thinking: its `content` goes back as the next assistant turn's reasoning_content."""
    model_config = _CFG
    type: Literal["reasoning"]
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None  # refused: pdorch never produces it


ITEM_TYPES: dict[str, type[BaseModel]] = {"message": MessageItem, "function_call": FunctionCallItem,
                                          "function_call_output": FunctionCallOutputItem, "reasoning": ReasoningItem}


def input_item(item: dict, param: str) -> BaseModel:
    """One `input` item, validated as its type's model; a 400 naming `param` (input.N) and the key."""
    kind = item.get("type", "message")
    model = ITEM_TYPES.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise bad_request(f"{param}.type: {kind!r} items are not served (served: {', '.join(ITEM_TYPES)})",
                          param=param + ".type")
    try:
        out = model.model_validate(item)
    except ValidationError as e:
        loc, msg = explain(e.errors(include_url=False))
        where = f"{param}.{loc}" if loc else param
        raise bad_request(f"{where}: {msg}", param=where) from None
    if isinstance(out, ReasoningItem) and out.encrypted_content is not None:
        raise bad_request(f"{param}.encrypted_content: encrypted reasoning is not served (send its content)",
                          param=param + ".encrypted_content")
    return out
