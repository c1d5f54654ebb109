"""Sending the profile's requests to a router and turning the timed streams into profile points.

Each point is measured `runs` times; the point keeps the medians. Every reply must be complete and
report 0 cached tokens (the prompts are unique): anything else ends the profile with ProfileError
rather than writing a capacity the fleet does not have.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from bench.profile.points import burst_size, full_batch_window, saturated_tokens_per_s
from bench.profile.stream import Timed, UniquePrompts, timed_generate

MAX_DOUBLINGS = 4  # a decode run's output tokens double at most this often to get a full-batch window


class ProfileError(RuntimeError):
    pass


@dataclass(frozen=True)
class Settings:
    runs: int                 # measurements per point (medians kept)
    saturate_tokens: int      # prompt tokens of one saturating prefill burst
    output_tokens: int        # generated tokens of each decode stream (first try)
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

    async def _send(self, prompt_tokens: int, output_tokens: int, count: int) -> list[Timed]:
        """`count` requests at once, each with its own uncached prompt."""
        replies = await asyncio.gather(*(timed_generate(self.client, self.url, self.prompts.next(prompt_tokens),
                                                        output_tokens) for _ in range(count)))
        for r in replies:
            if r.error is not None:
                raise ProfileError(f"a request of {prompt_tokens} prompt tokens failed: {r.error}")
            if r.cached_tokens:
                raise ProfileError(f"a unique prompt of {prompt_tokens} tokens had {r.cached_tokens} cached "
                                   "tokens: the profile needs uncached prompts")
        return replies

    async def warm_up(self, prompt_tokens: int) -> None:
        """One request whose timing is dropped: the first one through a fresh cluster pays one-off costs."""
        await self._send(prompt_tokens, 2, 1)

    async def prefill_point(self, prompt_tokens: int) -> dict:
        alone = [(await self._send(prompt_tokens, 1, 1))[0].ttft_s for _ in range(self.s.runs)]
        burst = burst_size(prompt_tokens, self.s.saturate_tokens)
        rates = []
        for _ in range(self.s.runs):
            replies = await self._send(prompt_tokens, 1, burst)
            rates.append(saturated_tokens_per_s(min(r.sent for r in replies),
                                                [r.token_times[0] for r in replies], prompt_tokens))
        point = {"prompt_tokens": prompt_tokens, "tokens_per_s": statistics.median(rates),
                 "ttft_s": statistics.median(alone)}
        self.say(f"prefill {prompt_tokens:>6} tokens: TTFT alone {point['ttft_s'] * 1000:8.1f} ms, "
                 f"saturated {point['tokens_per_s']:9.0f} tokens/s (bursts of {burst})")
        return point

    async def decode_point(self, batch: int, context_tokens: int) -> dict:
        rates, itls = [], []
        for _ in range(self.s.runs):
            output_tokens = self.s.output_tokens
            for _ in range(MAX_DOUBLINGS + 1):
                replies = await self._send(context_tokens, output_tokens, batch)
                window = full_batch_window([r.token_times for r in replies])
                if window is not None and window.tokens >= self.s.min_window_tokens * batch:
                    break
                output_tokens *= 2
            else:
                raise ProfileError(f"decode batch {batch}, context {context_tokens}: the {batch} streams were never "
                                   f"all decoding for {self.s.min_window_tokens} tokens each, up to "
                                   f"{output_tokens // 2} output tokens (prefills too slow for the batch?)")
            rates.append(window.tokens_per_s)
            itls.append(window.itl_p90_s)
        point = {"batch": batch, "context_tokens": context_tokens, "tokens_per_s": statistics.median(rates),
                 "itl_s": statistics.median(itls)}
        self.say(f"decode batch {batch:>3}, context {context_tokens:>6}: {point['tokens_per_s']:8.1f} tokens/s, "
                 f"ITL p90 {point['itl_s'] * 1000:7.1f} ms")
        return point
