"""From a parsed request body to the worker's SamplingParams: the ranges pydantic cannot express,
the fields refused by name (never silently dropped), the served defaults, n. A handler makes its
body's in one call: `openai_sampling` (chat, completions) or `sglang_sampling` (/generate)."""

from __future__ import annotations

from typing import NamedTuple, TypeVar

from pydantic import BaseModel

from proto.pdorch.v1 import worker_pb2
from router.errors import bad_request
from router.http.bodies import (
    INT32_MAX,
    INT64_MAX,
    INT64_MIN,
    ChatCompletionRequest,
    SGLangSampling,
    _OpenAISampling,
)
from router.http.logprobs import MAX_TOP_LOGPROBS, openai_logprobs

Body = TypeVar("Body", bound=BaseModel)


class BodySampling(NamedTuple):  # NOTE: made per request: immutable as a frozen dataclass, 3x cheaper to make
    """A body's sampling as the worker takes it, and what the job's limits need of the body."""

    params: worker_pb2.SamplingParams  # without max_tokens (RouterService.start sets it against the limits)
    max_tokens: int | None  # as asked; None: the route's default
    max_tokens_param: str  # the field that asked it (named by a limit's 400)
    top: int | None = None  # OpenAI's top logprobs asked (None: no logprobs)


def openai_sampling(req, chat: bool, defaults: dict, max_n: int, tokenizer) -> BodySampling:
    """A chat or completions body's sampling, checked: the model's `defaults` where it left a field
    unset, n within `max_n` (router.max_n), logprobs, bad_words tokenized, the request_id's form."""
    sp, max_tokens = sampling_from_openai(with_defaults(req, defaults))
    check_n(sp.n, max_n)
    top = openai_logprobs(req, chat)
    if top is not None:
        sp.logprobs = top
        if not chat and req.echo:  # the prompt's tokens with their logprobs: P computes them all
            sp.prompt_logprobs = max(top, req.prompt_logprobs or 0)
    if req.bad_words:  # NOTE: only a body with bad_words pays their tokenizing and the proto extend
        sp.bad_words.extend(worker_pb2.TokenIds(ids=w) for w in bad_words_ids(req.bad_words, tokenizer))
    check_request_id(req.request_id)
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    return BodySampling(sp, max_tokens, param, top)


def sglang_sampling(params: SGLangSampling, defaults: dict, max_n: int) -> BodySampling:
    """/generate's sampling_params, checked: the model's `defaults` where unset, n within `max_n`."""
    sp, max_tokens = sampling_from_sglang(with_defaults(params, defaults))
    check_n(sp.n, max_n, "sampling_params.n")
    return BodySampling(sp, max_tokens, "sampling_params.max_new_tokens")


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
    # vLLM's extras (the fields of its protocol; tests/unit/test_router_fields.py lists them)
    "use_beam_search": ((None, False), "beam search is not served: use n"),
    "length_penalty": ((None, 1.0, 1), "a length penalty is beam search's, which is not served"),
    "watermarking": ((None, False), "watermarking is not served"),
    "truncate_prompt_tokens": ((None,), "prompts are not truncated here: send the tokens to keep"),
    "truncation_side": ((None,), "prompts are not truncated here: send the tokens to keep"),
    "logprob_token_ids": ((None,), "logprobs of chosen token ids are not served: use logprobs / top_logprobs"),
    "priority": ((None, 0), "request priorities are not served"),
    "return_tokens_as_token_ids": ((None, False), "logprob tokens are returned as text"),
    "return_token_ids": ((None, False), "token ids are not returned here: /generate returns output_ids"),
    "return_token_offsets": ((None, False), "token offsets are not served"),
    "return_mm_kwargs": ((None, True), "this server serves text only"),
    "routed_experts_prompt_start": ((None, 0), "expert routing data is not served"),
    "cache_salt": ((None,), "the KV cache is not salted per request"),
    "kv_transfer_params": ((None,), "KV transfer is this server's own (docs/design.md)"),
    "ec_transfer_params": ((None,), "encoder-cache transfer is not served"),
    "vllm_xargs": ((None,), "vLLM's custom extension arguments are not served"),
    "repetition_detection": ((None,), "repetition detection is not served: use the penalties"),
    "thinking_token_budget": ((None, -1), "a thinking budget is not served"),
    "stream_interval": ((None,), "each chunk carries what the decode worker sent since the last"),
}

# Per route: fields one route serves and the other does not know, or serves with another default.
CHAT_REFUSED: dict[str, tuple[tuple, str]] = {
    **REFUSED,
    "echo": ((None, False), "vLLM's chat echo (the last message leads the answer) is not served"),
    "add_special_tokens": ((None, False), "a chat prompt's special tokens are the chat template's"),
    "documents": ((None,), "documents for the chat template are not served"),
    "media_io_kwargs": ((None, {}), "this server serves text only"),
    "mm_processor_kwargs": ((None, {}), "this server serves text only"),
    "include_reasoning": ((None, True), "the reasoning always comes back in reasoning_content"),
    "return_prompt_text": ((None, False), "the prompt's text is not returned: use /tokenize"),
}
COMPLETION_REFUSED: dict[str, tuple[tuple, str]] = {
    **REFUSED,
    "top_logprobs": ((None,), "completions take logprobs: <int>, the number of alternatives (0-20)"),
    "add_special_tokens": ((None, True), "a prompt is encoded with the model's special tokens: send token ids"),
    "prompt_embeds": ((None,), "prompt embeddings are not served: send text or token ids"),
}

# A chat message's fields that are not served (what an earlier OpenAI answer may carry).
MESSAGE_REFUSED: dict[str, tuple[tuple, str]] = {
    "audio": ((None,), "this server serves text only"),
    "refusal": ((None,), "an earlier refusal is not served: put its text in content"),
    "function_call": ((None,), "the deprecated function_call is not served: use tool_calls"),
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
    chat = isinstance(req, ChatCompletionRequest)
    refuse_unserved(req, CHAT_REFUSED if chat else COMPLETION_REFUSED)
    if isinstance(req, ChatCompletionRequest):  # (chat, as the type checker narrows it)
        for i, message in enumerate(req.messages):
            refuse_unserved(message, MESSAGE_REFUSED, f"messages.{i}.")
    if req.stream_options is not None and req.stream_options.include_obfuscation:
        raise bad_request("stream_options.include_obfuscation=true is not supported: stream events are not padded",
                          param="stream_options.include_obfuscation")
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
    _output(sp, req.skip_special_tokens, req.spaces_between_special_tokens, req.include_stop_str_in_output)
    sp.allowed_token_ids.extend(_allowed(req.allowed_token_ids))
    if req.prompt_logprobs is not None:
        check_prompt_logprobs(req.prompt_logprobs, req.stream)
        sp.prompt_logprobs = req.prompt_logprobs
    sp.n = _n(1 if req.n is None else req.n, "n")  # the handler checks it against router.max_n (check_n)
    return sp, max_tokens


def _output(sp: worker_pb2.SamplingParams, skip_special: bool, spaces_between: bool, include_stop: bool) -> None:
    """How the decode worker writes the output text (engine/stop.py); the proto leaves the defaults unset."""
    if not skip_special:
        sp.skip_special_tokens = False
    if not spaces_between:
        sp.spaces_between_special_tokens = False
    sp.include_stop_str_in_output = include_stop


def _allowed(ids: list[int] | None) -> list[int]:
    """allowed_token_ids in range; the vocabulary is checked with the prompt's ids (RouterService.make_job)."""
    if ids is None:
        return []
    if not ids or any(not 0 <= t <= INT32_MAX for t in ids):
        raise bad_request("allowed_token_ids must be a non-empty array of token ids", param="allowed_token_ids")
    return ids


def check_prompt_logprobs(k: int, stream: bool) -> None:
    """vLLM's bounds: 0 to 20 alternatives, not streamed (they come with the whole answer)."""
    if not 0 <= k <= MAX_TOP_LOGPROBS:
        raise bad_request(f"prompt_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {k}", param="prompt_logprobs")
    if stream:
        raise bad_request("prompt_logprobs are not available when stream=true", param="prompt_logprobs")


MAX_BAD_WORDS = 256


def bad_words_ids(words: list[str] | None, tokenizer) -> list[list[int]]:
    """vLLM's bad_words as token sequences: each word as it is (leading blanks dropped) and, where the
    encoding with a leading space is another word of the same length, that one too."""
    out: list[list[int]] = []
    if words and len(words) > MAX_BAD_WORDS:  # each is matched against every row's output every step
        raise bad_request(f"bad_words: at most {MAX_BAD_WORDS} words, got {len(words)}", param="bad_words")
    for word in words or ():
        if not word.strip():
            raise bad_request("bad_words must be non-empty words", param="bad_words")
        plain = tokenizer.encode(word.lstrip(), add_special_tokens=False)
        spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
        out.append(plain)
        if spaced[0] != plain[0] and len(spaced) == len(plain):
            out.append(spaced)
    return out


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
    # NOTE: proto3 leaves a zero out of the bytes: only the fields a body sets are written
    if presence:
        sp.presence_penalty = presence
    if frequency:
        sp.frequency_penalty = frequency
    sp.repetition_penalty = 1.0 if repetition is None else repetition
    if min_tokens:
        sp.min_tokens = min_tokens
    if bias:
        sp.logit_bias.update(bias)


# generation_config.json keys a request may leave to the model (vLLM's --generation-config auto)
DEFAULTABLE = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def with_defaults(req: Body, defaults: dict) -> Body:
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
    _output(sp, s.skip_special_tokens, s.spaces_between_special_tokens, s.no_stop_trim)
    sp.n = _n(s.n, "sampling_params.n")
    return sp, s.max_new_tokens


def _n(n: int, param: str) -> int:
    if not 1 <= n <= INT32_MAX:
        raise bad_request(f"{param} must be >= 1, got {n}", param=param)
    return n


def check_request_id(request_id: str | None) -> str | None:
    """vLLM's request_id: the request's id (as /generate's rid), printable and at most 128 characters."""
    if request_id is not None and not (0 < len(request_id) <= 128 and request_id.isprintable()):
        raise bad_request("request_id must be 1 to 128 printable characters", param="request_id")
    return request_id


def check_n(n: int, max_n: int, param: str = "n") -> None:
    if not 1 <= n <= max_n:
        raise bad_request(f"{param} must be in [1, {max_n}] (router.max_n), got {n}", param=param)
