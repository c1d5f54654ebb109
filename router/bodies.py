"""Request bodies of the HTTP API (OpenAI + SGLang-native) and their validation.

Bodies are parsed with `model_validate_json` in strict mode: wrong types are errors (a string
where a number belongs is not coerced), unknown fields are ignored (clients such as SGLang's
benchmarks send extras like `lora_path`). Range checks that pydantic cannot express, and the
mapping to the worker's SamplingParams, live in `sampling_from_*`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from proto.pdorch.v1 import worker_pb2
from router.errors import bad_request

_CFG = ConfigDict(strict=True, extra="ignore")
# The worker protocol's integer widths (worker.proto): JSON numbers beyond them are the client's
# mistake, answered 400 here (protobuf would raise ValueError, a 500).
INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class StreamOptions(BaseModel):
    model_config = _CFG
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM: with include_usage, usage so far on every chunk too


class TextPart(BaseModel):
    model_config = _CFG
    type: Literal["text"]
    text: str


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
    # structured outputs: OpenAI's, vLLM's and SGLang's spellings (router/structured.py)
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
    # accepted, with no effect on the output (docs/api.md)
    prompt_cache_key: str | None = None  # OpenAI's cache-routing hint: the router's session key
    safety_identifier: str | None = None


class ChatCompletionRequest(_OpenAISampling):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict | None = None  # extra variables for the chat template (e.g. enable_thinking)
    add_generation_prompt: bool = True


class CompletionRequest(_OpenAISampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool | None = None
    logprobs: int | None = None  # completions use an int here


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
    json_schema: str | None = None  # structured outputs (router/structured.py)
    regex: str | None = None
    ebnf: str | None = None
    n: int = 1
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


def parse(model_cls: type[BaseModel], body: bytes) -> BaseModel:
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
        loc, msg = _explain(errors)
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


def _explain(errors: list[dict]) -> tuple[str, str]:
    """(field path, message) for the first error. A value that fits no member of a union gets one
    message listing the accepted types, unless exactly one member got past the type check (then
    its own deeper error says more)."""
    first = errors[0]
    tag_at = next((i for i, part in enumerate(first["loc"]) if _is_type_tag(part)), None)
    if tag_at is None:
        return ".".join(str(x) for x in first["loc"]), first["msg"]
    base = first["loc"][:tag_at]
    branches: dict[str, list[dict]] = {}
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


def _stops(stop: str | list[str] | None, param: str = "stop") -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else list(stop)
    if len(stops) > 16 or any(not s for s in stops):
        raise bad_request(f"{param}: at most 16 non-empty strings", param=param)
    return stops


def _check_common(temperature: float, top_p: float, top_k: int, token_ids: list[int] | None,
                  prefix: str = "", min_p: float = 0.0) -> None:
    """Ranges of the sampling fields; `prefix` is where they sit in the body ("sampling_params.")."""
    if not 0.0 <= temperature <= 100.0:
        raise bad_request(f"{prefix}temperature must be in [0, 100], got {temperature}", param=prefix + "temperature")
    if not 0.0 < top_p <= 1.0:
        raise bad_request(f"{prefix}top_p must be in (0, 1], got {top_p}", param=prefix + "top_p")
    if not -1 <= top_k <= INT32_MAX:
        raise bad_request(f"{prefix}top_k must be -1 (disabled), 0 (disabled) or positive up to {INT32_MAX}, "
                          f"got {top_k}", param=prefix + "top_k")
    if not 0.0 <= min_p <= 1.0:
        raise bad_request(f"{prefix}min_p must be in [0, 1], got {min_p}", param=prefix + "min_p")
    if token_ids and any(not 0 <= t <= INT32_MAX for t in token_ids):
        raise bad_request(f"{prefix}stop_token_ids must be token ids in [0, {INT32_MAX}]",
                          param=prefix + "stop_token_ids")


def _check_seed(seed: int | None, param: str) -> None:
    if seed is not None and not INT64_MIN <= seed <= INT64_MAX:
        raise bad_request(f"{param} must be a 64-bit signed integer, got {seed}", param=param)


def _check_max_tokens(max_tokens: int | None, param: str) -> None:
    if max_tokens is not None and not 1 <= max_tokens <= INT32_MAX:
        raise bad_request(f"{param} must be in [1, {INT32_MAX}], got {max_tokens}", param=param)


# Fields of the OpenAI bodies (and vLLM / SGLang extras) that would change the output and are not
# served yet: a value other than what pdorch does anyway is refused, never silently dropped.
# name -> (the values served, why / what to do instead). docs/api.md lists them beside vLLM and SGLang.
REFUSED: dict[str, tuple[tuple, str]] = {
    "best_of": ((None, 1), "use n: the client chooses among the n choices"),
    "suffix": ((None, ""), "insertion (a suffix) is not served"),
    "audio": ((None,), "this server serves text only"),
    "modalities": ((None, ["text"]), "this server serves text only"),
    "prediction": ((None,), "predicted outputs are not served"),
    "reasoning_effort": ((None,), "use chat_template_kwargs (e.g. enable_thinking) for a reasoning model"),
    "verbosity": ((None,), "not served"),
    "web_search_options": ((None,), "web search is not served"),
    "functions": ((None,), "the deprecated functions field is not served: use tools"),
    "function_call": ((None,), "the deprecated function_call field is not served: use tool_choice"),
    "store": ((None, False), "stored completions are not served"),
    "metadata": ((None, {}), "metadata tags stored completions, which are not served"),
    "service_tier": ((None, "auto", "default"), "only the default tier is served"),
    "moderation": ((None,), "moderation is not served"),
    "prompt_cache_retention": ((None,), "the KV cache's retention is the operator's (docs/workers.md)"),
    "prompt_cache_options": ((None,), "the KV cache's retention is the operator's (docs/workers.md)"),
    "lora_path": ((None,), "LoRA adapters are not served"),
}


# The same for SGLang's sampling_params.
SGLANG_REFUSED: dict[str, tuple[tuple, str]] = {
    "structural_tag": ((None,), "structural tags are not served yet: use json_schema, regex or ebnf"),
}


def refuse_unserved(req: BaseModel, refused: dict[str, tuple[tuple, str]] = REFUSED, prefix: str = "") -> None:
    """400 naming the first field set to a value pdorch would not honour (`refused`). NOTE: only the
    fields the body sets are read (every default is served): the hot path pays a set intersection."""
    hits = req.model_fields_set & refused.keys()
    if not hits:
        return
    for name in (n for n in refused if n in hits):  # in `refused`'s order: the same field named first
        served, why = refused[name]
        value = getattr(req, name)
        if not any(value == v and type(value) is type(v) or value is v for v in served):
            raise bad_request(f"{prefix}{name}={value!r} is not supported: {why}", param=prefix + name)


def sampling_from_openai(req: _OpenAISampling) -> tuple[worker_pb2.SamplingParams, int | None]:
    """(params without max_tokens, requested max_tokens or None)."""
    refuse_unserved(req)
    temperature = 1.0 if req.temperature is None else req.temperature
    top_p = 1.0 if req.top_p is None else req.top_p
    top_k = -1 if req.top_k is None else req.top_k
    min_p = 0.0 if req.min_p is None else req.min_p
    _check_common(temperature, top_p, top_k, req.stop_token_ids, min_p=min_p)
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    _check_max_tokens(max_tokens, param)
    _check_seed(req.seed, "seed")
    sp = worker_pb2.SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                                   stop=_stops(req.stop),
                                   stop_token_ids=req.stop_token_ids or [], ignore_eos=req.ignore_eos)
    if req.seed is not None:
        sp.seed = req.seed
    _controls(sp, req.presence_penalty, req.frequency_penalty, req.repetition_penalty, req.logit_bias,
              req.min_tokens, max_tokens)
    sp.n = _n(1 if req.n is None else req.n, "n")  # the handler checks it against router.max_n (check_n)
    return sp, max_tokens


def _controls(sp: worker_pb2.SamplingParams, presence: float | None, frequency: float | None,
              repetition: float | None, logit_bias: dict | None, min_tokens: int | None, max_tokens: int | None,
              prefix: str = "", min_param: str = "min_tokens") -> None:
    """Penalties, logit_bias and min_tokens into `sp`, range-checked (vLLM's bounds; OpenAI's for the bias)."""
    for name, value in (("presence_penalty", presence), ("frequency_penalty", frequency)):
        if value is not None and not -2.0 <= value <= 2.0:
            raise bad_request(f"{prefix}{name} must be in [-2, 2], got {value}", param=prefix + name)
    if repetition is not None and not 0.0 < repetition <= 10.0:
        raise bad_request(f"{prefix}repetition_penalty must be in (0, 10], got {repetition}",
                          param=prefix + "repetition_penalty")
    if min_tokens is not None and not 0 <= min_tokens <= (max_tokens or INT32_MAX):
        raise bad_request(f"{prefix}{min_param} must be in [0, max_tokens], got {min_tokens}", param=prefix + min_param)
    bias = {}
    for key, value in (logit_bias or {}).items():
        if not key.lstrip("-").isdigit() or not 0 <= int(key) <= INT32_MAX:
            raise bad_request(f"{prefix}logit_bias keys must be token ids, got {key!r}", param=prefix + "logit_bias")
        if not -100.0 <= value <= 100.0:
            raise bad_request(f"{prefix}logit_bias values must be in [-100, 100], got {value}",
                              param=prefix + "logit_bias")
        bias[int(key)] = value
    sp.presence_penalty, sp.frequency_penalty = presence or 0.0, frequency or 0.0
    sp.repetition_penalty = 1.0 if repetition is None else repetition
    sp.min_tokens = min_tokens or 0
    sp.logit_bias.update(bias)


# generation_config.json keys a request may leave to the model (vLLM's --generation-config auto)
DEFAULTABLE = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def with_defaults(req: BaseModel, defaults: dict) -> BaseModel:
    """`req` with the model's sampling `defaults` where it left a field unset (absent or null)."""
    unset = {k: v for k, v in defaults.items() if k not in req.model_fields_set or getattr(req, k) is None}
    return req.model_copy(update=unset) if unset else req


def sampling_from_sglang(s: SGLangSampling) -> tuple[worker_pb2.SamplingParams, int | None]:
    refuse_unserved(s, SGLANG_REFUSED, "sampling_params.")
    _check_common(s.temperature, s.top_p, s.top_k, s.stop_token_ids, "sampling_params.", s.min_p)
    _check_max_tokens(s.max_new_tokens, "sampling_params.max_new_tokens")
    _check_seed(s.seed, "sampling_params.seed")
    _check_seed(s.sampling_seed, "sampling_params.sampling_seed")
    sp = worker_pb2.SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, min_p=s.min_p,
                                   stop=_stops(s.stop, "sampling_params.stop"), stop_token_ids=s.stop_token_ids or [],
                                   ignore_eos=s.ignore_eos)
    seed = s.seed if s.seed is not None else s.sampling_seed
    if seed is not None:
        sp.seed = seed
    _controls(sp, s.presence_penalty, s.frequency_penalty, s.repetition_penalty, s.logit_bias, s.min_new_tokens,
              s.max_new_tokens, "sampling_params.", "min_new_tokens")
    sp.n = _n(s.n, "sampling_params.n")
    return sp, s.max_new_tokens


def _n(n: int, param: str) -> int:
    if not 1 <= n <= INT32_MAX:
        raise bad_request(f"{param} must be >= 1, got {n}", param=param)
    return n


def check_n(n: int, max_n: int, param: str = "n") -> None:
    if not 1 <= n <= max_n:
        raise bad_request(f"{param} must be in [1, {max_n}] (router.max_n), got {n}", param=param)
