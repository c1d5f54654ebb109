"""One simulated run: a fleet (fixed, or driven by the planner) serving an arrival list, interval by interval.

Per interval: the interval's arrivals are prefilled (world.py), their streams decode in steps, and the interval's
TTFT p90 (requests arriving in it) and ITL p90 (over the tokens generated in it) are checked against the SLOs.
Then the scaler sees the interval and may change the fleet: a new replica serves `startup_s` after it was asked
for; a removed one takes no new work and is paid for until its queue (prefill) or streams (decode) are done.
Replica-seconds count every replica from the moment it is asked for until it is gone.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from bench.autoscale.arrivals import Request
from bench.autoscale.world import World
from pdorch.planner.observation import Observation


@dataclass
class Replica:
    ready_at: float
    retired: bool = False
    free_at: float = 0.0  # prefill: when its queue is done


@dataclass
class SimFleet:
    """The actuator the planner drives in the simulation (pdorch.planner.actuator.Actuator)."""

    startup_s: float
    now: float = 0.0
    replicas: dict[str, list[Replica]] = field(default_factory=lambda: {"prefill": [], "decode": []})
    name: str = "simulated"

    def current(self) -> dict[str, int]:
        return {role: sum(not r.retired for r in rs) for role, rs in self.replicas.items()}

    def apply(self, desired: dict[str, int]) -> None:
        for role, n in desired.items():
            live = [r for r in self.replicas[role] if not r.retired]
            for _ in range(n - len(live)):
                self.replicas[role].append(Replica(self.now + self.startup_s, free_at=self.now + self.startup_s))
            for r in sorted(live, key=lambda r: -r.ready_at)[:max(0, len(live) - n)]:  # the newest go first
                r.retired = True


@dataclass(frozen=True)
class IntervalResult:
    ttft_p90_s: float | None
    itl_p90_s: float | None
    met: bool
    replicas: dict[str, int]


def weighted_p90(values: list[float], weights: list[float]) -> float | None:
    if not values:
        return None
    order = np.argsort(values)
    v, w = np.asarray(values)[order], np.asarray(weights)[order]
    cum = np.cumsum(w)
    return float(v[np.searchsorted(cum, 0.9 * cum[-1])])


def simulate(requests: list[Request], world: World, scaler, initial: dict[str, int], interval_s: float,
             step_s: float, startup_s: float, slo: dict[str, float]) -> tuple[list[IntervalResult], float]:
    """(per-interval results, replica-seconds). `scaler(k, observation, fleet)` may call fleet.apply()."""
    fleet = SimFleet(startup_s)
    for role, n in initial.items():
        fleet.replicas[role] = [Replica(0.0) for _ in range(n)]
    pending: list[tuple[float, int, float]] = []  # (first token at, tokens left, context) not yet decoding
    stream_replica = np.zeros(0, dtype=np.int64)
    left = np.zeros(0)
    context = np.zeros(0)
    results, cost, ri = [], 0.0, 0
    duration = requests[-1].arrival_s if requests else 0.0
    for k in range(int(np.ceil(duration / interval_s))):
        t0, t1 = k * interval_s, (k + 1) * interval_s
        ttfts, batch = [], []
        prefill = fleet.replicas["prefill"]
        while ri < len(requests) and requests[ri].arrival_s < t1:
            q = requests[ri]
            ri += 1
            batch.append(q)
            ready = [r for r in prefill if not r.retired and r.ready_at <= q.arrival_s] or \
                [r for r in prefill if not r.retired]
            r = min(ready, key=lambda r: max(r.free_at, r.ready_at))
            alone, busy = world.prefill(q.uncached_tokens)
            start = max(q.arrival_s, r.free_at, r.ready_at)
            r.free_at = start + busy
            ttfts.append(start - q.arrival_s + alone)
            heapq.heappush(pending, (start + alone, q.output_tokens - 1, float(q.prompt_tokens)))
        itls, itl_weights = [], []
        decode = fleet.replicas["decode"]
        for t in np.arange(t0, t1, step_s):
            open_ = [i for i, r in enumerate(decode) if not r.retired and r.ready_at <= t]
            counts = np.bincount(stream_replica, minlength=len(decode)).astype(float)
            joined = []
            while pending and pending[0][0] <= t and open_:
                _, n, ctx = heapq.heappop(pending)
                i = min(open_, key=lambda i: counts[i])
                counts[i] += 1
                joined.append((i, n, ctx))
            if joined:
                stream_replica = np.concatenate([stream_replica, [j[0] for j in joined]])
                left = np.concatenate([left, [j[1] for j in joined]])
                context = np.concatenate([context, [j[2] for j in joined]])
            ctx_sum = np.bincount(stream_replica, weights=context, minlength=len(decode))
            itl = np.array([world.itl(c, ctx_sum[i] / c) if c else 1.0 for i, c in enumerate(counts)])
            made = step_s / itl[stream_replica]
            left -= made
            context += made
            for i, c in enumerate(counts):
                if c:
                    itls.append(itl[i])
                    itl_weights.append(c * step_s / itl[i])
            done = left <= 0
            if done.any():
                stream_replica, left, context = stream_replica[~done], left[~done], context[~done]
            busy_decode = set(stream_replica.tolist())
            alive = sum(1 for r in prefill if not r.retired or r.free_at > t) + \
                sum(1 for i, r in enumerate(decode) if not r.retired or i in busy_decode)
            cost += alive * step_s
        ttft_p90 = float(np.percentile(ttfts, 90)) if ttfts else None
        itl_p90 = weighted_p90(itls, itl_weights)
        met = (ttft_p90 is None or ttft_p90 <= slo["ttft"]) and (itl_p90 is None or itl_p90 <= slo["itl"])
        results.append(IntervalResult(ttft_p90, itl_p90, met, fleet.current()))
        fleet.now = t1
        scaler(k, _observation(batch, interval_s, ttft_p90, itl_p90), fleet)
    return results, cost


def _observation(batch: list[Request], interval_s: float, ttft: float | None, itl: float | None) -> Observation:
    """What the routers' /metrics would have said about the interval (observation.py's terms)."""
    return Observation(interval_s=interval_s, requests=len(batch),
                       prompt_tokens=sum(q.prompt_tokens for q in batch),
                       output_tokens=sum(q.output_tokens for q in batch),
                       cached_tokens_by_tier={"device": sum(q.prompt_tokens - q.uncached_tokens for q in batch)},
                       ttft_p90_s=ttft, itl_p90_s=itl)
