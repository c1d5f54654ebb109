"""/generate bodies whose sampling the router has validated before: read without pydantic, their
sampling from a memo.

Clients of /generate send the same few `sampling_params` request after request (a benchmark's, an
application's); the prompt and max_new_tokens change. The full path (parse: pydantic, router/http/bodies.py;
the ranges, refusals and defaults: router/http/body_sampling.py) cost ~9 µs a request warm and
~45 µs on the bench's latency phase (docs/benchmarks.md). A *plain* body (input_ids or text;
sampling_params of scalar values; stream, rid; none of the logprob fields) is read with orjson and
its sampling_params, less max_new_tokens, looked up in a memo. Only the full path fills the memo:
with the SamplingParams it built from a body whose every sampling value it read as the body gave it.
Anything else (a first sight, a list value, min_new_tokens, logprobs, a wrong type, malformed JSON)
takes the full path, which gives every error: the plain path never serves a body the full path
would refuse, and serves each as the full path would (tests/unit/test_plain_generate.py).
"""

from __future__ import annotations

from typing import NamedTuple

import orjson

from proto.pdorch.v1 import worker_pb2
from router.http.bodies import INT32_MAX, GenerateRequest, SGLangSampling
from router.http.body_sampling import BodySampling

MAX_TOKENS_PARAM = "sampling_params.max_new_tokens"
# GenerateRequest's fields a plain body may set; any other field of it sends the body the full way.
# Keys that are none of its fields are ignored, as the full path's model ignores them.
_PLAIN = frozenset({"input_ids", "text", "sampling_params", "stream", "rid"})
_NOT_PLAIN = frozenset(GenerateRequest.model_fields) - _PLAIN
_SCALARS = frozenset({int, float, str, bool, type(None)})
MEMO_CAPACITY = 1024  # distinct sampling_params; past it the memo starts again (a bound, not an LRU)
MAX_KEY_STR = 256  # a longer string value (a long stop string) takes the full path: the memo's size stays bounded

SamplingKey = tuple  # ((name, type, value), ...) of a body's sampling_params in its order, less max_new_tokens


class PlainGenerate(NamedTuple):  # NOTE: made per request: immutable as a frozen dataclass, 3x cheaper to make
    """A plain /generate body: its prompt (input_ids, or the text to encode), stream, rid, its sampling."""

    prompt: list[int] | str
    stream: bool
    rid: str | None
    sampling: BodySampling


class PlainGenerateReader:
    """Reads plain /generate bodies against the memo of sampling_params the full path validated."""

    def __init__(self, capacity: int = MEMO_CAPACITY):
        self.capacity = capacity
        self._memo: dict[SamplingKey, bytes] = {}  # key -> the SamplingParams (serialized) the full path made

    def read(self, body: bytes) -> tuple[PlainGenerate | None, SamplingKey | None]:
        """(the body read, None) when it is plain and its sampling known; else (None, its sampling's
        key when the full path may teach it (`learn`), or None)."""
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None, None
        if doc.__class__ is not dict or not _NOT_PLAIN.isdisjoint(doc):
            return None, None
        ids, text = doc.get("input_ids"), doc.get("text")
        prompt: list[int] | str
        # NOTE: type(t) per id, as pydantic's strict list[int] (a bool is not a token id)
        if text is None and ids.__class__ is list and not set(map(type, ids)) - {int}:
            prompt = ids
        elif ids is None and text.__class__ is str:
            prompt = text
        else:
            return None, None
        stream, rid = doc.get("stream", False), doc.get("rid")
        if stream.__class__ is not bool or (rid is not None and rid.__class__ is not str):
            return None, None
        params = doc.get("sampling_params", {})
        if params.__class__ is not dict or "min_new_tokens" in params:  # it is checked against max_new_tokens
            return None, None
        max_tokens = params.get("max_new_tokens")
        if max_tokens is not None and (max_tokens.__class__ is not int or not 1 <= max_tokens <= INT32_MAX):
            return None, None
        key = _key(params)
        if key is None:
            return None, None
        known = self._memo.get(key)
        if known is None:
            return None, key
        sampling = BodySampling(worker_pb2.SamplingParams.FromString(known), max_tokens, MAX_TOKENS_PARAM)
        return PlainGenerate(prompt, stream, rid, sampling), None

    def learn(self, key: SamplingKey, params: SGLangSampling, sampling: BodySampling) -> None:
        """The full path's `sampling` of a body whose sampling_params had `key`, remembered when the
        model it validated holds every value of the key as the body gave it (its own reading of
        the same bytes: a value it converted, defaulted or ignored is not taken on trust)."""
        fields = params.model_fields_set
        for name, _, value in key:
            if name not in fields or getattr(params, name) != value:
                return
        if len(self._memo) >= self.capacity:
            self._memo.clear()
        self._memo[key] = sampling.params.SerializeToString()


def _key(params: dict) -> SamplingKey | None:
    """The memo's key of a body's sampling_params: each value with its type (0, 0.0 and false are
    different bodies to a strict model); None when a value is not a scalar or a long string."""
    key = []
    for name, value in params.items():
        if value.__class__ not in _SCALARS or value.__class__ is str and len(value) > MAX_KEY_STR:
            return None
        if name != "max_new_tokens":
            key.append((name, value.__class__, value))
    return tuple(key)
