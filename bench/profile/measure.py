"""Sending the profile's requests to a router and turning the timed streams into profile points.

Each point is measured `runs` times; the point keeps the medians. Every reply must be complete, and a
prefill request must report 0 cached tokens (its prompt is unique): anything else ends the profile with
ProfileError rather than writing a capacity the fleet does not have.

A decode run first primes its B prompts (one token each, so their KV stays in the decode worker's prefix
cache), then sends them again at once: the decode worker takes the cached prefixes and computes the last
partial page itself (decode.max_local_prefill_tokens), so the B streams enter the batch together instead
of one prefill apart, and their contexts stay about C while they are measured.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from bench.profile.points import burst_size, full_batch_window, saturated_tokens_per_s
from bench.profile.stream import Timed, UniquePrompts, timed_generate


class ProfileError(RuntimeError):
    pass


@dataclass(frozen=True)
class Settings:
    runs: int                 # measurements per point (medians kept)
    saturate_tokens: int      # prompt tokens of one saturating prefill burst
    max_output_tokens: int    # a decode stream's max_new_tokens: it is cut once the window is full
    min_window_tokens: int    # tokens per stream the full-batch window must hold
    timeout_s: float          # deadline of one request


class Profiler:
    def __init__(self, url: str, prompts: UniquePrompts, settings: Settings, say: Callable[[str], None],
                 api_key: str = ""):
        self.url, self.prompts, self.s, self.say = url, prompts, settings, say
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(settings.timeout_s, connect=30.0), headers=headers,
                                        limits=httpx.Limits(max_connections=256))

    async def close(self) -> None:
        await self.client.aclose()

    async def _send(self, prompts: list[list[int]], output_tokens: int, stop=None,
                    uncached: bool = True) -> list[Timed]:
        """All `prompts` at once. `uncached`: each must report 0 cached tokens, else some."""
        replies = await asyncio.gather(*(timed_generate(self.client, self.url, ids, output_tokens, stop)
                                         for ids in prompts))
        for ids, r in zip(prompts, replies, strict=True):
            if r.error is not None:
                raise ProfileError(f"a request of {len(ids)} prompt tokens failed: {r.error}")
            if uncached and r.cached_tokens:
                raise ProfileError(f"a unique prompt of {len(ids)} tokens had {r.cached_tokens} cached "
                                   "tokens: the profile needs uncached prompts")
            if not uncached and not r.cached_tokens:
                raise ProfileError(f"a primed prompt of {len(ids)} tokens had no cached token: the decode "
                                   "worker kept no prefix (decode.prefix_cache off, or too few decode.num_pages?)")
        return replies

    def _fresh(self, prompt_tokens: int, count: int) -> list[list[int]]:
        return [self.prompts.next(prompt_tokens) for _ in range(count)]

    async def warm_up(self, prompt_tokens: int) -> None:
        """One request whose timing is dropped: the first one through a fresh cluster pays one-off costs."""
        await self._send(self._fresh(prompt_tokens, 1), 2)

    async def prefill_point(self, prompt_tokens: int) -> dict:
        alone = [(await self._send(self._fresh(prompt_tokens, 1), 1))[0].ttft_s for _ in range(self.s.runs)]
        burst = burst_size(prompt_tokens, self.s.saturate_tokens)
        rates = []
        for _ in range(self.s.runs):
            replies = await self._send(self._fresh(prompt_tokens, burst), 1)
            rates.append(saturated_tokens_per_s(min(r.sent for r in replies),
                                                [r.token_times[0] for r in replies], prompt_tokens))
        point = {"prompt_tokens": prompt_tokens, "tokens_per_s": statistics.median(rates),
                 "ttft_s": statistics.median(alone)}
        self.say(f"prefill {prompt_tokens:>6} tokens: TTFT alone {point['ttft_s'] * 1000:8.1f} ms, "
                 f"saturated {point['tokens_per_s']:9.0f} tokens/s (bursts of {burst})")
        return point

    async def decode_point(self, batch: int, context_tokens: int) -> dict:
        rates, itls, grown = [], [], 0
        for _ in range(self.s.runs):
            prompts = self._fresh(context_tokens, batch)
            await self._send(prompts, 1)  # priming: their KV now sits in the decode worker's prefix cache
            full = FullBatch(batch, self.s.min_window_tokens)
            replies = await self._send(prompts, self.s.max_output_tokens, full.stop, uncached=False)
            window = full_batch_window([r.token_times for r in replies])
            if window is None or window.tokens < self.s.min_window_tokens * batch:
                t0 = min(r.sent for r in replies)
                seen = ", ".join(f"{r.token_times[0] - t0:.3f}-{r.token_times[-1] - t0:.3f} s ({len(r.token_times)})"
                                 for r in replies)
                raise ProfileError(f"decode batch {batch}, context {context_tokens}: the {batch} streams were never "
                                   f"all decoding for {self.s.min_window_tokens} tokens each within "
                                   f"{self.s.max_output_tokens} output tokens (raise --max-output-tokens); first-last "
                                   f"token (tokens): {seen}")
            rates.append(window.tokens_per_s)
            itls.append(window.itl_p90_s)
            grown = max(grown, *(sum(t <= window.start for t in r.token_times) for r in replies))
        point = {"batch": batch, "context_tokens": context_tokens, "tokens_per_s": statistics.median(rates),
                 "itl_s": statistics.median(itls)}
        self.say(f"decode batch {batch:>3}, context {context_tokens:>6}: {point['tokens_per_s']:8.1f} tokens/s, "
                 f"ITL p90 {point['itl_s'] * 1000:7.1f} ms (a stream generated up to {grown} tokens before "
                 "the batch was full)")
        return point


class FullBatch:
    """Cuts a decode run short: once all `batch` streams have their first token (the batch is full) and
    then each has `min_tokens` more, every stream closes at its next chunk. The stream whose chunk met
    that closes first, so the window (up to the first close) holds min_tokens x batch tokens at least."""

    def __init__(self, batch: int, min_tokens: int):
        self.batch, self.min_tokens = batch, min_tokens
        self.streams: dict[int, Timed] = {}

    def stop(self, stream: Timed) -> bool:
        self.streams[id(stream)] = stream
        if len(self.streams) < self.batch:
            return False
        start = max(s.token_times[0] for s in self.streams.values())
        return all(sum(t > start for t in s.token_times) >= self.min_tokens for s in self.streams.values())
