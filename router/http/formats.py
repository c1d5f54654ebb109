"""Response bodies: OpenAI chat/completions (stream + non-stream) and SGLang `/generate`.

`Progress` accumulates D's chunks (token id and text deltas, per-tier cached counts); the
`*_chunk` / `*_final` functions turn it into the wire format. SSE framing is `data: <json>\\n\\n`
and streams end with `data: [DONE]`.
"""

from __future__ import annotations

import json
from typing import Protocol

from starlette.responses import Response

from router.errors import APIError
from router.metrics import CACHE_TIERS

try:
    import orjson

    def dumps(obj) -> bytes:
        return orjson.dumps(obj)
except ImportError:  # pragma: no cover - orjson is a dependency; json is the fallback
    import json

    def dumps(obj) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()

DONE = b"data: [DONE]\n\n"


def json_response(obj, status: int = 200) -> Response:
    return Response(dumps(obj), status_code=status, media_type="application/json")


def error_response(error: APIError) -> Response:
    """An APIError as the client gets it: its status, headers and OpenAI-shaped JSON body."""
    return Response(json.dumps(error.body()), status_code=error.status, headers=error.headers,
                    media_type="application/json")


def sse(obj) -> bytes:
    return b"data: " + dumps(obj) + b"\n\n"


class Progress:
    __slots__ = (
        "device",
        "finish_reason",
        "host",
        "inflight",
        "logprobs",
        "matched_stop",
        "output_ids",
        "paused_s",
        "preemptions",
        "prompt_logprobs",
        "prompt_tokens",
        "request_id",
        "ssd",
        "store",
        "text",
    )

    def __init__(self, request_id: str, prompt_tokens: int):
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self.device = self.host = self.store = self.ssd = self.inflight = 0
        self.output_ids: list[int] = []
        self.logprobs: list = []  # worker_pb2.TokenLogprob per output id, when asked for
        self.prompt_logprobs: list = []  # worker_pb2.TokenLogprob of prompt tokens 1 .. n-1, when asked for
        self.text = ""
        self.finish_reason = ""
        self.matched_stop = ""
        self.preemptions, self.paused_s = 0, 0.0  # the decode pool ran dry (decode_node/preemption.py)

    def add(self, msg) -> str:
        """Fold one GenerateResponse in; returns its text delta."""
        if msg.prompt_tokens:
            self.prompt_tokens = msg.prompt_tokens
        # since the previous chunk: additive, across failover too. A preemption is counted by its
        # `paused` chunk (at once), its pause by the first chunk after the resume.
        self.preemptions += msg.preemptions
        self.paused_s += msg.paused_s
        if msg.HasField("cached"):
            c = msg.cached
            self.device, self.host, self.store, self.ssd, self.inflight = c.device, c.host, c.store, c.ssd, c.inflight
        self.output_ids.extend(msg.token_ids)
        if msg.logprobs:
            self.logprobs.extend(msg.logprobs)
        if msg.prompt_logprobs:  # the first chunk's
            self.prompt_logprobs = list(msg.prompt_logprobs)
        self.text += msg.text
        if msg.finish_reason:
            self.finish_reason = msg.finish_reason
            self.matched_stop = msg.matched_stop
        return msg.text

    @property
    def cached_tokens(self) -> int:
        return self.device + self.host + self.store + self.ssd + self.inflight

    def cached_by_tier(self) -> dict:
        return {tier: getattr(self, tier) for tier in CACHE_TIERS}

    def usage(self) -> dict:
        # NOTE: `cached_tokens_details` and `preemptions` are ours (OpenAI's usage has neither);
        # clients ignore unknown keys.
        n = len(self.output_ids)
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": n,
                "total_tokens": self.prompt_tokens + n,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens,
                                          "cached_tokens_details": self.cached_by_tier()},
                "preemptions": self.preemptions}


# ---------------------------------------------------------------------------------- OpenAI
def _finish(p: Progress) -> str | None:
    return p.finish_reason or None


def chat_chunk(p: Progress, oid: str, created: int, model: str, delta_text: str, first: bool,
               include_usage: bool, continuous_usage: bool = False, logprobs: dict | None = None,
               index: int = 0) -> bytes:
    delta = {"role": "assistant", "content": delta_text} if first else {"content": delta_text}
    return chat_delta_chunk(p, oid, created, model, delta, _finish(p), include_usage, continuous_usage, logprobs,
                            index)


def chat_delta_chunk(p: Progress, oid: str, created: int, model: str, delta: dict, finish: str | None,
                     include_usage: bool, continuous_usage: bool = False, logprobs: dict | None = None,
                     index: int = 0) -> bytes:
    """A chat chunk with any delta (tool calls: router/http/tools.py); `logprobs`: its tokens' (router/http/logprobs.py);
    `index`: the choice it continues (n > 1)."""
    body = {"id": oid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}
    if include_usage:  # OpenAI: null on content chunks, the totals in a last chunk of their own
        body["usage"] = p.usage() if continuous_usage else None
    return sse(body)


def completion_chunk(p: Progress, oid: str, created: int, model: str, delta_text: str, first: bool,
                     include_usage: bool, continuous_usage: bool = False, logprobs: dict | None = None,
                     index: int = 0) -> bytes:
    body = {"id": oid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": index, "text": delta_text, "logprobs": logprobs, "finish_reason": _finish(p)}]}
    if include_usage:  # OpenAI: null on content chunks, the totals in a last chunk of their own
        body["usage"] = p.usage() if continuous_usage else None
    return sse(body)


class HasUsage(Protocol):
    """A request's usage so far: one choice's `Progress`, or all of them (router/http/choices.py `Total`)."""

    def usage(self) -> dict: ...


def usage_chunk(p: HasUsage, oid: str, created: int, model: str, chat: bool) -> bytes:
    return sse({"id": oid, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": created, "model": model, "choices": [], "usage": p.usage()})


def chat_final(p: Progress, oid: str, created: int, model: str, message: dict | None = None,
               finish: str | None = None, logprobs: dict | None = None) -> dict:
    """`message` / `finish`: given for a tool call (router/http/tools.py), else the text and its finish."""
    return {"id": oid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": message or {"role": "assistant", "content": p.text},
                         "logprobs": logprobs, "finish_reason": finish or _finish(p)}],
            "usage": p.usage()}


def completion_final(p: Progress, oid: str, created: int, model: str, logprobs: dict | None = None,
                     echo: str = "") -> dict:
    """`echo`: the prompt's text, leading the output's (echo: true)."""
    return {"id": oid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": echo + p.text, "logprobs": logprobs, "finish_reason": _finish(p)}],
            "usage": p.usage()}


# ---------------------------------------------------------------------------------- SGLang
def generate_body(p: Progress, e2e_s: float, logprobs: dict | None = None) -> dict:
    """`logprobs`: meta_info's output_token_logprobs etc. (router/http/logprobs.py), when asked for."""
    if p.finish_reason == "length":
        finish = {"type": "length", "length": len(p.output_ids)}
    elif p.finish_reason:
        finish = {"type": p.finish_reason, "matched": p.matched_stop or None}
    else:
        finish = None
    return {"text": p.text, "output_ids": list(p.output_ids),
            "meta_info": {"id": p.request_id, "finish_reason": finish, "prompt_tokens": p.prompt_tokens,
                          "completion_tokens": len(p.output_ids), "cached_tokens": p.cached_tokens,
                          "cached_tokens_details": p.cached_by_tier(),
                          "preemptions": p.preemptions, "preempted_s": round(p.paused_s, 6),
                          "e2e_latency": round(e2e_s, 6), **(logprobs or {})}}
