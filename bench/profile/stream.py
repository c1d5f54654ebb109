"""One timed `/generate` stream and the uncached prompts the profile sends.

`UniquePrompts` gives every request ids no other request of the run shares: its first two ids spell
its serial number over the ordinary vocabulary, so even the first page differs between any two prompts
(no prefix cache, in-flight sharing or store hit is possible); the rest are seeded random ids.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from bench.multiturn.client import sse_events


class UniquePrompts:
    def __init__(self, vocabulary: range, avoid: frozenset[int], seed: int = 0):
        self.tokens = [t for t in vocabulary if t not in avoid]
        self.rng = random.Random(seed)
        self.serial = 0

    def next(self, length: int) -> list[int]:
        n = len(self.tokens)
        if self.serial >= n * n:
            raise ValueError(f"more than {n * n} prompts: the serial number no longer fits two ids")
        head = [self.tokens[self.serial // n], self.tokens[self.serial % n]]
        self.serial += 1
        return (head + [self.rng.choice(self.tokens) for _ in range(max(0, length - 2))])[:length]


@dataclass
class Timed:
    """One stream as the client saw it: the arrival time of every token (chunks spread evenly over
    the tokens they carry, as bench/multiturn/client.py's TokenClock does)."""

    sent: float
    token_times: list[float] = field(default_factory=list)
    cached_tokens: int = 0
    error: str | None = None
    cut: bool = False  # the client closed the stream before its last token (`stop` said so)

    @property
    def ttft_s(self) -> float | None:
        return self.token_times[0] - self.sent if self.token_times else None


async def timed_generate(client: httpx.AsyncClient, url: str, ids: list[int], output_tokens: int,
                         stop: Callable[[Timed], bool] | None = None) -> Timed:
    """`stop`: asked after each chunk; True closes the stream there (the router aborts the request)."""
    body = {"input_ids": ids, "stream": True,
            "sampling_params": {"max_new_tokens": output_tokens, "temperature": 0.0, "ignore_eos": True}}
    out = Timed(sent=time.perf_counter())
    try:
        async with client.stream("POST", url.rstrip("/") + "/generate", json=body) as r:
            if r.status_code != 200:
                out.error = f"HTTP {r.status_code}: {(await r.aread()).decode()[:160]}"
                return out
            seen, last = 0, None
            async for event in sse_events(r):
                if "error" in event:
                    out.error = str(event["error"])[:200]
                    return out
                now = time.perf_counter()
                ids_now = len(event.get("output_ids") or [])
                new = ids_now - seen
                if new > 0:
                    start = out.sent if last is None else last
                    if last is None:  # the first token has no gap before it
                        out.token_times.append(now)
                        new -= 1
                        start = now
                    out.token_times.extend(start + (now - start) * (i + 1) / new for i in range(new))
                    seen, last = ids_now, now
                out.cached_tokens = (event.get("meta_info") or {}).get("cached_tokens", out.cached_tokens)
                if stop is not None and out.token_times and stop(out):
                    out.cut = True
                    return out
    except (httpx.HTTPError, ValueError) as e:
        out.error = f"{type(e).__name__}: {e}"[:200]
    if out.error is None and not out.cut and len(out.token_times) != output_tokens:
        out.error = f"{len(out.token_times)} tokens streamed, {output_tokens} asked (ignore_eos)"
    return out
