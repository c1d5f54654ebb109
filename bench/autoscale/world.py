"""The simulated replicas' latency: the profile read as the truth about one replica.

- prefill: a replica serves its queue first come first served; a request of U uncached tokens holds it for
  U / R(U) seconds and its TTFT is its wait in the queue plus T0(U), the profile's alone TTFT (R and T0
  interpolated as the planner does). The queueing is simulated request by request, not modelled.
- decode: every `step_s` each stream of a replica advances step_s / ITL tokens, ITL = the profile's p90 ITL at the
  replica's current batch and mean context (linear between measured batches and contexts; beyond the largest
  batch measured it keeps growing along the last two points' line, where the planner refuses to go).
"""

from __future__ import annotations

from pdorch.planner.capacity import lerp
from pdorch.planner.profile import Profile


class World:
    def __init__(self, profile: Profile):
        xs = [float(p.prompt_tokens) for p in profile.prefill]
        self._prefill = (xs, [p.ttft_s for p in profile.prefill], [p.tokens_per_s for p in profile.prefill])
        self._contexts = sorted({p.context_tokens for p in profile.decode})
        self._by_context = {c: sorted((p.batch, p.itl_s) for p in profile.decode if p.context_tokens == c)
                            for c in self._contexts}

    def prefill(self, uncached_tokens: int) -> tuple[float, float]:
        """(alone TTFT, seconds the replica is busy) for one request."""
        xs, ttft, rate = self._prefill
        return lerp(uncached_tokens, xs, ttft), uncached_tokens / lerp(uncached_tokens, xs, rate)

    def itl(self, batch: float, context: float) -> float:
        per_context = [self._itl_by_batch(c, batch) for c in self._contexts]
        return lerp(context, [float(c) for c in self._contexts], per_context)

    def _itl_by_batch(self, context: int, batch: float) -> float:
        points = self._by_context[context]
        if len(points) > 1 and batch > points[-1][0]:
            (b0, y0), (b1, y1) = points[-2], points[-1]
            return y1 + (y1 - y0) * (batch - b1) / (b1 - b0)
        return lerp(batch, [float(b) for b, _ in points], [y for _, y in points])
