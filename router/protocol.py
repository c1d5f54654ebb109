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


class StreamOptions(BaseModel):
    model_config = _CFG
    include_usage: bool = False


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
        err = e.errors(include_url=False)[0]
        if err["type"] in ("json_invalid", "json_type"):
            raise bad_request(f"malformed JSON body: {err['msg']}") from None
        loc = ".".join(str(x) for x in err["loc"])
        if not loc:
            raise bad_request(f"request body: {err['msg']}") from None
        raise bad_request(f"{loc}: {err['msg']}", param=loc) from None


def _stops(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else list(stop)
    if len(stops) > 16 or any(not s for s in stops):
        raise bad_request("stop: at most 16 non-empty strings", param="stop")
    return stops


def _check_common(temperature: float, top_p: float, top_k: int, token_ids: list[int] | None) -> None:
    if not 0.0 <= temperature <= 100.0:
        raise bad_request(f"temperature must be in [0, 100], got {temperature}", param="temperature")
    if not 0.0 < top_p <= 1.0:
        raise bad_request(f"top_p must be in (0, 1], got {top_p}", param="top_p")
    if top_k < -1:
        raise bad_request(f"top_k must be -1 (disabled), 0 (disabled) or positive, got {top_k}", param="top_k")
    if token_ids and any(t < 0 for t in token_ids):
        raise bad_request("stop_token_ids must be non-negative", param="stop_token_ids")


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
    _check_common(temperature, top_p, top_k, req.stop_token_ids)
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    if max_tokens is not None and max_tokens < 1:
        raise bad_request(f"{param} must be at least 1, got {max_tokens}", param=param)
    sp = worker_pb2.SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, stop=_stops(req.stop),
                                   stop_token_ids=req.stop_token_ids or [], ignore_eos=req.ignore_eos)
    if req.seed is not None:
        sp.seed = req.seed
    return sp, max_tokens


def sampling_from_sglang(s: SGLangSampling) -> tuple[worker_pb2.SamplingParams, int | None]:
    _check_common(s.temperature, s.top_p, s.top_k, s.stop_token_ids)
    if s.max_new_tokens is not None and s.max_new_tokens < 1:
        raise bad_request(f"sampling_params.max_new_tokens must be at least 1, got {s.max_new_tokens}",
                          param="sampling_params.max_new_tokens")
    sp = worker_pb2.SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                                   stop=_stops(s.stop), stop_token_ids=s.stop_token_ids or [],
                                   ignore_eos=s.ignore_eos)
    seed = s.seed if s.seed is not None else s.sampling_seed
    if seed is not None:
        sp.seed = seed
    return sp, s.max_new_tokens
