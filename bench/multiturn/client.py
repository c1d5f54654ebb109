"""Backends that answer one Prompt of `pdorch bench multiturn`, timing it as a client sees it.

`HttpBackend` streams from the router: SGLang-native `/generate` (token ids in, cumulative
`output_ids` and `meta_info` out) or OpenAI `/v1/chat/completions` (messages in, text deltas and a
final `usage` chunk out). TTFT = request sent -> first chunk carrying tokens; ITL = the gap between
chunks spread over the tokens each chunk brings (OpenAI chunks carry no count: one token each).
Greedy decoding; SGLang requests ignore EOS so every answer has exactly --output-tokens tokens.
"""

from __future__ import annotations

import dataclasses
import json
import time

import httpx

from bench.multiturn.conversation import Prompt


@dataclasses.dataclass
class Reply:
    output_ids: list[int] | None  # None: the API does not return ids (OpenAI)
    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    tiers: dict | None = None     # cached_tokens_details when the API reports it
    finish_reason: str | None = None
    ttft_s: float | None = None
    itl_s: list = dataclasses.field(default_factory=list)
    error: str | None = None


class TokenClock:
    """TTFT and inter-token gaps from the arrival time of each chunk and the tokens it carries."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.last: float | None = None
        self.ttft: float | None = None
        self.itl: list[float] = []

    def tokens(self, n: int) -> None:
        if n <= 0:
            return
        now = time.perf_counter()
        if self.ttft is None:
            self.ttft = now - self.t0
            n -= 1  # the first token has no gap before it
        elif self.last is not None:
            self.itl.extend([(now - self.last) / n] * n)
        self.last = now


async def sse_events(response: httpx.Response):
    """JSON objects of a `data: ...` event stream, until `[DONE]`."""
    async for line in response.aiter_lines():
        if not line.startswith("data: "):
            continue
        data = line[6:].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)


class HttpBackend:
    def __init__(self, url: str | list[str], api: str, model: str, output_tokens: int, timeout_s: float,
                 max_connections: int, api_key: str = ""):
        """`url`: a router, or router replicas (requests spread over them round-robin)."""
        self.urls = [u.rstrip("/") for u in ([url] if isinstance(url, str) else url)]
        self._sent = 0
        self.url, self.api, self.model, self.output_tokens = self.urls[0], api, model, output_tokens
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=30.0), headers=headers,
                                        limits=httpx.Limits(max_connections=max_connections + 4))

    async def close(self) -> None:
        await self.client.aclose()

    def _router(self, prompt: Prompt) -> str:
        """Round-robin per request, as a Kubernetes Service spreads new connections over a router
        Deployment's pods: a router sees 1/N of each conversation's turns."""
        self._sent += 1
        return self.urls[self._sent % len(self.urls)]

    async def send(self, prompt: Prompt, output_tokens: int | None = None) -> Reply:
        """`output_tokens`: this request's answer length (default: the backend's)."""
        n = self.output_tokens if output_tokens is None else output_tokens
        try:
            if self.api == "openai":
                return await self._openai(prompt, n)
            return await self._sglang(prompt, n)
        except (httpx.HTTPError, ValueError, KeyError) as e:
            return Reply(output_ids=[] if self.api == "sglang" else None, error=f"{type(e).__name__}: {e}"[:200])

    async def _sglang(self, prompt: Prompt, output_tokens: int) -> Reply:
        body = {"input_ids": prompt.ids, "stream": True, "rid": f"mt-{prompt.client}-{prompt.round}",
                "sampling_params": {"max_new_tokens": output_tokens, "temperature": 0.0, "ignore_eos": True}}
        reply, clock = Reply(output_ids=[]), TokenClock()
        async with self.client.stream("POST", self._router(prompt) + "/generate", json=body) as r:
            if r.status_code != 200:
                return Reply(output_ids=[], error=f"HTTP {r.status_code}: {(await r.aread()).decode()[:160]}")
            async for event in sse_events(r):
                if "error" in event:
                    return Reply(output_ids=[], error=str(event["error"])[:200])
                ids = event.get("output_ids") or []
                clock.tokens(len(ids) - len(reply.output_ids))
                reply.output_ids, reply.text = list(ids), event.get("text", "")
                meta = event.get("meta_info") or {}
                reply.prompt_tokens = meta.get("prompt_tokens", reply.prompt_tokens)
                reply.cached_tokens = meta.get("cached_tokens", reply.cached_tokens)
                reply.tiers = meta.get("cached_tokens_details", reply.tiers)
                finish = meta.get("finish_reason")
                reply.finish_reason = finish.get("type") if isinstance(finish, dict) else reply.finish_reason
        reply.completion_tokens = len(reply.output_ids)
        reply.ttft_s, reply.itl_s = clock.ttft, clock.itl
        return reply

    async def _openai(self, prompt: Prompt, output_tokens: int) -> Reply:
        body = {"model": self.model, "messages": prompt.messages, "max_tokens": output_tokens,
                "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
        reply, clock, parts = Reply(output_ids=None), TokenClock(), []
        async with self.client.stream("POST", self._router(prompt) + "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                return Reply(output_ids=None, error=f"HTTP {r.status_code}: {(await r.aread()).decode()[:160]}")
            async for event in sse_events(r):
                if "error" in event:
                    return Reply(output_ids=None, error=str(event["error"])[:200])
                for choice in event.get("choices") or []:
                    delta = (choice.get("delta") or {}).get("content") or ""
                    clock.tokens(1)
                    parts.append(delta)
                    reply.finish_reason = choice.get("finish_reason") or reply.finish_reason
                usage = event.get("usage")
                if usage:
                    reply.prompt_tokens = usage["prompt_tokens"]
                    reply.completion_tokens = usage["completion_tokens"]
                    reply.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                    details = (usage.get("prompt_tokens_details") or {}).get("cached_tokens_details")
                    reply.tiers = details or reply.tiers
        reply.text = "".join(parts)
        reply.ttft_s, reply.itl_s = clock.ttft, clock.itl
        return reply
