"""Request bodies of the HTTP API (OpenAI + SGLang-native) and their validation.

Bodies are parsed with `model_validate_json` in strict mode: wrong types are errors (a string
where a number belongs is not coerced), unknown fields are ignored (clients such as SGLang's
benchmarks send extras like `lora_path`). Range checks that pydantic cannot express, the fields
refused by name, and the mapping to the worker's SamplingParams are in `router/http/body_sampling.py`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from router.errors import bad_request

_CFG = ConfigDict(strict=True, extra="ignore")
Model = TypeVar("Model", bound=BaseModel)  # the body's type: what parse() validates into
# The worker protocol's integer widths (worker.proto): JSON numbers beyond them are the client's
# mistake, answered 400 here (protobuf would raise ValueError, a 500).
INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class StreamOptions(BaseModel):
    model_config = _CFG
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM: with include_usage, usage so far on every chunk too
    include_obfuscation: bool | None = None  # OpenAI's padding of stream events: refused when true


class TextPart(BaseModel):
    model_config = _CFG
    type: Literal["text"]
    text: str
    prompt_cache_breakpoint: dict | None = None  # OpenAI's caching hint: every full page is cached here anyway


class FunctionCall(BaseModel):
    model_config = _CFG
    name: str
    arguments: str  # JSON text, as the model wrote it


class ToolCall(BaseModel):
    model_config = _CFG
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = _CFG
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant turn that called tools
    tool_call_id: str | None = None  # a tool turn: the call it answers
    reasoning_content: str | None = None  # an assistant turn's thinking, for templates that replay it (Qwen3)
    # refused when set (body_sampling.MESSAGE_REFUSED): an earlier answer's audio, refusal, function_call
    audio: Any = None
    refusal: Any = None
    function_call: Any = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class FunctionDef(BaseModel):
    model_config = _CFG
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict | None = None  # a JSON schema (None: no arguments)
    strict: bool | None = None


class Tool(BaseModel):
    model_config = _CFG
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    model_config = _CFG
    name: str


class NamedToolChoice(BaseModel):
    model_config = _CFG
    type: Literal["function"]
    function: NamedFunction


class AllowedTools(BaseModel):
    model_config = _CFG
    mode: Literal["auto", "required"]
    tools: list[NamedToolChoice] = Field(min_length=1)


class AllowedToolsChoice(BaseModel):
    """OpenAI's `allowed_tools`: every tool stays in the prompt, only these may be called."""
    model_config = _CFG
    type: Literal["allowed_tools"]
    allowed_tools: AllowedTools


class JSONSchemaFormat(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", populate_by_name=True)
    name: str = "response"
    description: str | None = None
    schema_: dict | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = _CFG
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs` (one of its keys)."""
    model_config = _CFG
    json_: dict | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None


class _OpenAISampling(BaseModel):
    model_config = _CFG
    model: str | None = None  # None: the served model (as SGLang and vLLM do)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None  # vLLM / SGLang extension
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    n: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    logprobs: bool | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    user: str | None = None
    # structured outputs: OpenAI's, vLLM's and SGLang's spellings (router/http/structured.py)
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    json_schema: dict | str | None = None
    # fields that change the output and are not served yet, refused when set (refused_fields)
    logit_bias: dict[str, float] | None = None  # token id (as a string, as JSON keys are) -> bias
    repetition_penalty: float | None = None  # vLLM / SGLang extension
    min_tokens: int | None = None  # vLLM extension
    best_of: Any = None
    top_logprobs: int | None = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None
    web_search_options: Any = None
    functions: Any = None
    function_call: Any = None
    store: Any = None
    metadata: Any = None
    service_tier: Any = None
    moderation: Any = None
    prompt_cache_retention: Any = None
    prompt_cache_options: Any = None
    suffix: Any = None
    lora_path: Any = None
    # vLLM's extras: honoured (docs/api.md)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    prompt_logprobs: int | None = None
    request_id: str | None = None  # the request's id (as /generate's rid)
    session_id: str | None = None  # a session key, as prompt_cache_key
    # vLLM's extras that are not served: refused when set to anything but their default (REFUSED)
    use_beam_search: Any = None
    length_penalty: Any = None
    watermarking: Any = None
    truncate_prompt_tokens: Any = None
    truncation_side: Any = None
    logprob_token_ids: Any = None
    add_special_tokens: Any = None
    priority: Any = None
    return_tokens_as_token_ids: Any = None
    return_token_ids: Any = None
    return_token_offsets: Any = None
    return_mm_kwargs: Any = None
    routed_experts_prompt_start: Any = None
    cache_salt: Any = None
    kv_transfer_params: Any = None
    ec_transfer_params: Any = None
    vllm_xargs: Any = None
    repetition_detection: Any = None
    thinking_token_budget: Any = None
    stream_interval: Any = None
    # accepted, with no effect on the output (docs/api.md)
    prompt_cache_key: str | None = None  # OpenAI's cache-routing hint: the router's session key
    safety_identifier: str | None = None


class ChatCompletionRequest(_OpenAISampling):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | AllowedToolsChoice | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict | None = None  # extra variables for the chat template (e.g. enable_thinking)
    add_generation_prompt: bool = True
    # vLLM's: the prompt ends inside the last message; a template of the request's own is refused
    # (router/http/chat_prompt.py)
    continue_final_message: bool = False
    chat_template: str | None = None
    # vLLM's chat extras that are not served: refused when set (CHAT_REFUSED)
    echo: Any = None
    documents: Any = None
    media_io_kwargs: Any = None
    mm_processor_kwargs: Any = None
    include_reasoning: Any = None
    return_prompt_text: Any = None


class CompletionRequest(_OpenAISampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool | None = None
    # completions use an int here (the base's is chat's bool): a pydantic field, redeclared on purpose
    logprobs: int | None = None  # type: ignore[assignment]
    prompt_embeds: Any = None  # vLLM's: refused (COMPLETION_REFUSED)


class SGLangSampling(BaseModel):
    model_config = _CFG
    max_new_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    seed: int | None = None
    sampling_seed: int | None = None
    json_schema: str | None = None  # structured outputs (router/http/structured.py)
    regex: str | None = None
    ebnf: str | None = None
    n: int = 1
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False  # the stop string stays in the output (vLLM's include_stop_str_in_output)
    # not served yet: refused when set (SGLANG_REFUSED)
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    logit_bias: dict[str, float] | None = None
    structural_tag: Any = None


class GenerateRequest(BaseModel):
    model_config = _CFG
    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: SGLangSampling = Field(default_factory=SGLangSampling)
    stream: bool = False
    rid: str | None = None
    return_logprob: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int | None = None  # -1 / absent: the output's logprobs only
    return_text_in_logprobs: bool = False


def parse(model_cls: type[Model], body: bytes) -> Model:
    """Validate a JSON body; any problem is a 400 naming the field."""
    if not body.strip():
        raise bad_request("request body is empty; expected a JSON object")
    try:
        return model_cls.model_validate_json(body)
    except ValidationError as e:
        errors = e.errors(include_url=False)
        err = errors[0]
        if err["type"] in ("json_invalid", "json_type"):
            raise bad_request(f"malformed JSON body: {err['msg']}") from None
        loc, msg = explain(errors)
        if not loc:
            raise bad_request(f"request body: {msg}") from None
        raise bad_request(f"{loc}: {msg}", param=loc) from None


# How a union member (a type tag in pydantic's error location) reads in an error message.
_TYPE_NAMES = {"str": "a string", "int": "an integer", "float": "a number", "bool": "a boolean",
               "list[int]": "an array of token ids (integers)", "list[str]": "an array of strings",
               "list[list[int]]": "an array of token-id arrays", "list[TextPart]": 'an array of {"type": "text", '
               '"text": ...} parts'}


def _is_type_tag(part) -> bool:
    """Union members appear in error locations as type tags ('str', 'list[int]', 'TextPart');
    field names are lower-case identifiers."""
    return isinstance(part, str) and (part in _TYPE_NAMES or "[" in part or part[:1].isupper())


def explain(errors: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """(field path, message) for the first error. A value that fits no member of a union gets one
    message listing the accepted types, unless exactly one member got past the type check (then
    its own deeper error says more)."""
    first = errors[0]
    tag_at = next((i for i, part in enumerate(first["loc"]) if _is_type_tag(part)), None)
    if tag_at is None:
        return ".".join(str(x) for x in first["loc"]), first["msg"]
    base = first["loc"][:tag_at]
    branches: dict[str, list[Mapping[str, Any]]] = {}
    for err in errors:
        loc = err["loc"]
        if len(loc) > tag_at and loc[:tag_at] == base and _is_type_tag(loc[tag_at]):
            branches.setdefault(loc[tag_at], []).append(err)
    deeper = [errs for errs in branches.values()
              if not (len(errs) == 1 and len(errs[0]["loc"]) == tag_at + 1 and errs[0]["type"].endswith("_type"))]
    if len(deeper) == 1:
        inner = deeper[0][0]
        loc = base + tuple(x for x in inner["loc"][tag_at + 1:] if not _is_type_tag(x))
        return ".".join(str(x) for x in loc), inner["msg"]
    names = [_TYPE_NAMES.get(tag, tag) for tag in branches]
    expected = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
    return ".".join(str(x) for x in base), f"expected {expected}"
