"""The load the planner sizes the fleet for: one interval's traffic, in the terms the capacity model needs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Load:
    request_rate: float  # requests per second
    mean_prompt_tokens: float
    uncached_fraction: float  # 1 - prompt cache hit rate (all tiers)
    mean_output_tokens: float

    @property
    def uncached_prompt_tokens(self) -> float:
        """Prompt tokens one request makes a prefill replica compute."""
        return self.mean_prompt_tokens * self.uncached_fraction

    @property
    def uncached_tokens_per_s(self) -> float:
        return self.request_rate * self.uncached_prompt_tokens
