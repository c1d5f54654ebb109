"""Request bodies of the HTTP API (OpenAI + SGLang-native) and their validation.

Bodies are parsed with `model_validate_json` in strict mode: wrong types are errors (a string
where a number belongs is not coerced), unknown fields are ignored (clients such as SGLang's
benchmarks send extras like `lora_path`). Range checks that pydantic cannot express, and the
mapping to the worker's SamplingParams, live in `sampling_from_*`.
"""

from __future__ import annotations

from typing import Literal

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


class ChatMessage(BaseModel):
    model_config = _CFG
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


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


class ChatCompletionRequest(_OpenAISampling):
    messages: list[ChatMessage] = Field(min_length=1)


class CompletionRequest(_OpenAISampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
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


class GenerateRequest(BaseModel):
    model_config = _CFG
    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: SGLangSampling = Field(default_factory=SGLangSampling)
    stream: bool = False
    rid: str | None = None
    return_logprob: bool = False


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


def sampling_from_openai(req: _OpenAISampling) -> tuple[worker_pb2.SamplingParams, int | None]:
    """(params without max_tokens, requested max_tokens or None)."""
    if req.n not in (None, 1):
        raise bad_request(f"n must be 1 (got {req.n}); generate several completions with several requests",
                          param="n")
    if req.logprobs:
        raise bad_request("logprobs are not supported", param="logprobs")
    for name in ("frequency_penalty", "presence_penalty"):
        if getattr(req, name) not in (None, 0, 0.0):
            raise bad_request(f"{name} is not supported (only 0)", param=name)
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
    return sp, max_tokens


def sampling_from_sglang(s: SGLangSampling) -> tuple[worker_pb2.SamplingParams, int | None]:
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
    return sp, s.max_new_tokens
