"""One simulated run: a fleet (fixed, or driven by the planner) serving an arrival list, interval by interval.

Per interval: the interval's arrivals are prefilled (world.py), their streams decode in steps, and the interval's
TTFT p90 (requests arriving in it) and ITL p90 (over the tokens generated in it) are checked against the SLOs.
The scaler sees every decision interval (the planner's, a divisor of the SLO interval) and may change the fleet: a new replica serves `startup_s` after it was asked
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
             step_s: float, startup_s: float, slo: dict[str, float],
             decide_s: float | None = None) -> tuple[list[IntervalResult], float]:
    """(per-interval results, replica-seconds). `scaler(k, observation, fleet)` may call fleet.apply(); it is called
    every `decide_s` (the planner's interval, a divisor of the SLO interval `interval_s`; default: `interval_s`)
    with that stretch's observation, as the runner scraping every planner.interval_s would see it."""
    decide_s = interval_s if decide_s is None else decide_s
    per = round(interval_s / decide_s)
    if per < 1 or abs(per * decide_s - interval_s) > 1e-9 or abs(round(decide_s / step_s) * step_s - decide_s) > 1e-9:
        raise ValueError(f"the decision interval {decide_s}s must divide the SLO interval {interval_s}s "
                         f"and be a multiple of the step {step_s}s")
    fleet = SimFleet(startup_s)
    for role, n in initial.items():
        fleet.replicas[role] = [Replica(0.0) for _ in range(n)]
    streams = _Streams()
    results, cost, ri, decisions = [], 0.0, 0, 0
    duration = requests[-1].arrival_s if requests else 0.0
    for k in range(int(np.ceil(duration / interval_s))):
        ttfts, itls, itl_weights = [], [], []
        for j in range(per):
            t0, t1 = k * interval_s + j * decide_s, k * interval_s + (j + 1) * decide_s
            batch, sub_ttfts = [], []
            while ri < len(requests) and requests[ri].arrival_s < t1:
                batch.append(requests[ri])
                sub_ttfts.append(_prefill(requests[ri], fleet.replicas["prefill"], world, streams.pending))
                ri += 1
            sub_itls, sub_weights, alive_s = streams.decode(fleet, world, t0, t1, step_s)
            cost += alive_s
            ttfts += sub_ttfts
            itls += sub_itls
            itl_weights += sub_weights
            fleet.now = t1
            if j < per - 1:
                scaler(decisions, _observation(batch, decide_s, _p90(sub_ttfts), weighted_p90(sub_itls, sub_weights),
                                               len(streams.left)), fleet)
                decisions += 1
                continue
            ttft_p90 = _p90(ttfts)
            itl_p90 = weighted_p90(itls, itl_weights)
            met = (ttft_p90 is None or ttft_p90 <= slo["ttft"]) and (itl_p90 is None or itl_p90 <= slo["itl"])
            results.append(IntervalResult(ttft_p90, itl_p90, met, fleet.current()))
            scaler(decisions, _observation(batch, decide_s, _p90(sub_ttfts), weighted_p90(sub_itls, sub_weights),
                                           len(streams.left)), fleet)
            decisions += 1
    return results, cost


def _p90(values: list[float]) -> float | None:
    return float(np.percentile(values, 90)) if values else None


def _prefill(q: Request, prefill: list[Replica], world: World, pending: list) -> float:
    """Queue q on the prefill replica that frees first (a ready one if any); its TTFT. Its stream joins `pending`."""
    ready = [r for r in prefill if not r.retired and r.ready_at <= q.arrival_s] or [r for r in prefill if not r.retired]
    r = min(ready, key=lambda r: max(r.free_at, r.ready_at))
    alone, busy = world.prefill(q.uncached_tokens)
    start = max(q.arrival_s, r.free_at, r.ready_at)
    r.free_at = start + busy
    heapq.heappush(pending, (start + alone, q.output_tokens - 1, float(q.prompt_tokens)))
    return start - q.arrival_s + alone


class _Streams:
    """The decoding streams: which replica each is on, tokens left, context; and those prefilled, not yet joined."""

    def __init__(self):
        self.pending: list[tuple[float, int, float]] = []  # (first token at, tokens left, context)
        self.replica = np.zeros(0, dtype=np.int64)
        self.left = np.zeros(0)
        self.context = np.zeros(0)

    def decode(self, fleet: SimFleet, world: World, t0: float, t1: float,
               step_s: float) -> tuple[list[float], list[float], float]:
        """Steps from t0 to t1: (ITL per replica-step, its token weight, replica-seconds paid)."""
        itls, weights, cost = [], [], 0.0
        prefill, decode = fleet.replicas["prefill"], fleet.replicas["decode"]
        for t in np.arange(t0, t1, step_s):
            open_ = [i for i, r in enumerate(decode) if not r.retired and r.ready_at <= t]
            counts = np.bincount(self.replica, minlength=len(decode)).astype(float)
            joined = []
            while self.pending and self.pending[0][0] <= t and open_:
                _, n, ctx = heapq.heappop(self.pending)
                i = min(open_, key=lambda i: counts[i])
                counts[i] += 1
                joined.append((i, n, ctx))
            if joined:
                self.replica = np.concatenate([self.replica, [j[0] for j in joined]])
                self.left = np.concatenate([self.left, [j[1] for j in joined]])
                self.context = np.concatenate([self.context, [j[2] for j in joined]])
            ctx_sum = np.bincount(self.replica, weights=self.context, minlength=len(decode))
            itl = np.array([world.itl(c, ctx_sum[i] / c) if c else 1.0 for i, c in enumerate(counts)])
            made = step_s / itl[self.replica]
            self.left -= made
            self.context += made
            for i, c in enumerate(counts):
                if c:
                    itls.append(itl[i])
                    weights.append(c * step_s / itl[i])
            done = self.left <= 0
            if done.any():
                self.replica, self.left, self.context = self.replica[~done], self.left[~done], self.context[~done]
            busy_decode = set(self.replica.tolist())
            alive = sum(1 for r in prefill if not r.retired or r.free_at > t) + \
                sum(1 for i, r in enumerate(decode) if not r.retired or i in busy_decode)
            cost += alive * step_s
        return itls, weights, cost


def _observation(batch: list[Request], interval_s: float, ttft: float | None, itl: float | None,
                 decoding: int) -> Observation:
    """What the routers' and decode workers' /metrics would have said about the interval (observation.py's terms);
    `decoding`: the streams running at its end (pdorch_decode_running_requests summed over the workers)."""
    return Observation(interval_s=interval_s, requests=len(batch),
                       prompt_tokens=sum(q.prompt_tokens for q in batch),
                       output_tokens=sum(q.output_tokens for q in batch),
                       cached_tokens_by_tier={"device": sum(q.prompt_tokens - q.uncached_tokens for q in batch)},
                       ttft_p90_s=ttft, itl_p90_s=itl, running={"decode": float(decoding)})
