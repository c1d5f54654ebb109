"""Per-replica capacity from a profile: how much load one replica takes while meeting the SLOs.

Prefill (TTFT). At an uncached prompt length L the profile gives, by linear interpolation between its points
(clamped to the first / last point outside them), the TTFT of one request alone, T0(L), and the prompt tokens per
second the replica sustains back to back, R(L). A request occupies the replica for S = L / R(L). With Poisson
arrivals at utilisation rho the request also waits in the replica's queue; its waiting time's p90 is taken from the
M/M/1 tail, P(wait > t) = rho * exp(-(1 - rho) * t / S):

    wait_p90(rho) = S * ln(10 * rho) / (1 - rho)    (0 when rho <= 0.1)
    TTFT_p90(rho) = T0(L) + wait_p90(rho)

M/M/1 rather than M/D/1 on purpose: one prompt length stands for a spread of lengths, so the service time varies,
and the exponential tail is the conservative one (M/D/1's waiting is about half of it). The prefill capacity is
rho* x R(L), rho* the largest utilisation (by bisection) with TTFT_p90(rho) <= planner.ttft_p90_s; 0 when even an
idle replica misses it (T0(L) > SLO).

Decode (ITL). The profile's decode points are grouped by context; within one context the p90 ITL is linear in the
batch between measured batches, and between two measured contexts linear in the context (clamped outside them).
The per-replica stream capacity is the largest batch b (1 .. the largest batch profiled at those contexts, and at
most decode.max_running_requests) with ITL(b, context) <= planner.itl_p90_s: the planner never trusts a batch the
profile did not measure. 0 when even one stream misses it.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass

from pdorch.planner.profile import DecodePoint, PrefillPoint


def lerp(x: float, xs: list[float], ys: list[float]) -> float:
    """Piecewise-linear y(x) through sorted (xs, ys), clamped to the end values outside them."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect_left(xs, x)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def wait_p90_s(service_s: float, rho: float) -> float:
    """p90 of the queueing wait at utilisation rho (the M/M/1 tail; see the module docstring)."""
    if rho <= 0.1:
        return 0.0
    if rho >= 1.0:
        return math.inf
    return service_s * math.log(10.0 * rho) / (1.0 - rho)


@dataclass(frozen=True)
class PrefillCapacity:
    prompt_tokens: float
    alone_ttft_s: float  # T0(L)
    saturated_tokens_per_s: float  # R(L)
    max_utilization: float  # rho*
    tokens_per_s: float  # rho* x R(L): what one replica takes within the TTFT SLO


def prefill_capacity(points: tuple[PrefillPoint, ...], uncached_prompt_tokens: float,
                     ttft_p90_s: float) -> PrefillCapacity:
    xs = [float(p.prompt_tokens) for p in points]
    length = max(1.0, uncached_prompt_tokens)
    alone = lerp(length, xs, [p.ttft_s for p in points])
    rate = lerp(length, xs, [p.tokens_per_s for p in points])
    rho = max_utilization(alone, length / rate, ttft_p90_s)
    return PrefillCapacity(length, alone, rate, rho, rho * rate)


def ttft_p90_s(alone_s: float, service_s: float, rho: float) -> float:
    return alone_s + wait_p90_s(service_s, rho)


def max_utilization(alone_s: float, service_s: float, slo_s: float) -> float:
    """Largest rho in [0, 1) with alone + wait_p90(rho) <= slo (to 1e-6); 0 when alone > slo."""
    if alone_s > slo_s:
        return 0.0
    lo, hi = 0.1, 1.0  # wait_p90 is 0 up to 0.1 and increasing above
    for _ in range(60):
        mid = (lo + hi) / 2
        if ttft_p90_s(alone_s, service_s, mid) <= slo_s:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class DecodeCapacity:
    context_tokens: float
    streams: int  # concurrent streams one replica runs within the ITL SLO
    itl_s: float  # the p90 ITL at that batch (0 streams: at batch 1)


def itl_at(points: tuple[DecodePoint, ...], batch: float, context_tokens: float) -> float:
    """p90 ITL at (batch, context): linear in batch within a context, then linear in context."""
    contexts = sorted({p.context_tokens for p in points})
    per_context = [_itl_by_batch(points, c, batch) for c in contexts]
    return lerp(context_tokens, [float(c) for c in contexts], per_context)


def decode_capacity(points: tuple[DecodePoint, ...], context_tokens: float, itl_p90_s: float,
                    max_running_requests: int) -> DecodeCapacity:
    contexts = sorted({p.context_tokens for p in points})
    # the batches measured at the contexts that bracket this one (clamped to the end ones)
    i = min(bisect_left(contexts, context_tokens), len(contexts) - 1)
    bracket = {contexts[i], contexts[max(0, i - 1)]} if context_tokens < contexts[i] else {contexts[i]}
    largest = min(max(p.batch for p in points if p.context_tokens == c) for c in bracket)
    for batch in range(min(largest, max_running_requests), 0, -1):
        itl = itl_at(points, batch, context_tokens)
        if itl <= itl_p90_s:
            return DecodeCapacity(context_tokens, batch, itl)
    return DecodeCapacity(context_tokens, 0, itl_at(points, 1, context_tokens))


def _itl_by_batch(points: tuple[DecodePoint, ...], context: int, batch: float) -> float:
    mine = sorted((p for p in points if p.context_tokens == context), key=lambda p: p.batch)
    return lerp(batch, [float(p.batch) for p in mine], [p.itl_s for p in mine])
