"""Replicas per role that meet the SLOs at least cost, without flapping.

Sizing (pure): prefill replicas = ceil(uncached prompt tokens/s / one replica's prefill capacity at the mean
uncached prompt length); decode replicas = ceil(concurrent streams / one replica's stream capacity), the streams by
Little's law: request rate x mean output tokens x the ITL at that capacity (the time a stream lives). Capacities
come from capacity.py. The load sized for is the runner's upper bound of the predicted load (upper_bound.py).
Each role is clamped to its [min, max].

Stability (`Decider`, which keeps the time of each role's last change):
- up: at once when the replicas that carry the load at `scale_up_utilization` of their capacity (headroom for the
  load that arrives while new replicas start) exceed the current ones, unless the role changed less than
  `up_cooldown_s` ago; "needs N" in the reasons is that count;
- down: only to the fleet that would still run at or below `scale_down_utilization` (<= scale_up_utilization;
  hysteresis: a need that wobbles around a boundary does not add and remove a replica every interval), and not
  within `down_cooldown_s` of the role's last change;
- a current count outside [min, max] is brought inside at once, cooldown or not.
Every `Decision` carries its inputs and a human-readable reason per role.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from pdorch.planner.capacity import DecodeCapacity, PrefillCapacity, decode_capacity, prefill_capacity
from pdorch.planner.load import Load
from pdorch.planner.profile import Profile

ROLES = ("prefill", "decode")


@dataclass(frozen=True)
class SizingParams:
    ttft_p90_s: float
    itl_p90_s: float
    min_replicas: dict[str, int]
    max_replicas: dict[str, int]
    up_cooldown_s: float = 0.0
    down_cooldown_s: float = 0.0
    scale_down_utilization: float = 0.8
    scale_up_utilization: float = 1.0
    max_running_requests: int = 1 << 30  # decode.max_running_requests: a replica never batches more

    def __post_init__(self):
        if not 0 < self.scale_down_utilization <= self.scale_up_utilization <= 1:
            raise ValueError("need 0 < scale_down_utilization <= scale_up_utilization <= 1")

    @classmethod
    def from_config(cls, cfg) -> SizingParams:
        p = cfg.planner
        return cls(p.ttft_p90_s, p.itl_p90_s, {"prefill": p.min_prefill, "decode": p.min_decode},
                   {"prefill": p.max_prefill, "decode": p.max_decode}, p.up_cooldown_s, p.down_cooldown_s,
                   p.scale_down_utilization, p.scale_up_utilization, cfg.decode.max_running_requests)


@dataclass(frozen=True)
class Sizing:
    """What the load needs, before bounds and stability."""

    prefill_demand: float  # uncached prompt tokens/s
    decode_demand: float  # concurrent streams
    prefill: PrefillCapacity
    decode: DecodeCapacity

    def per_replica(self, role: str) -> float:
        return self.prefill.tokens_per_s if role == "prefill" else float(self.decode.streams)

    def demand(self, role: str) -> float:
        return self.prefill_demand if role == "prefill" else self.decode_demand

    def needed(self, role: str, utilization: float = 1.0) -> int | None:
        """Replicas that carry the demand at `utilization` of their capacity; None: no count can (capacity 0)."""
        cap = self.per_replica(role) * utilization
        if cap <= 0:
            return None
        return math.ceil(self.demand(role) / cap - 1e-9)


def size(load: Load, profile: Profile, params: SizingParams) -> Sizing:
    pcap = prefill_capacity(profile.prefill, load.uncached_prompt_tokens, params.ttft_p90_s)
    context = load.mean_prompt_tokens + load.mean_output_tokens / 2  # a stream's mean context while decoding
    dcap = decode_capacity(profile.decode, context, params.itl_p90_s, params.max_running_requests)
    streams = load.request_rate * load.mean_output_tokens * dcap.itl_s
    return Sizing(load.uncached_tokens_per_s, streams, pcap, dcap)


@dataclass(frozen=True)
class RoleDecision:
    role: str
    current: int
    needed: int | None  # before bounds; None: the SLO cannot be met at any count
    desired: int
    action: str  # up | down | hold
    reason: str
    short_at_max: bool = False  # at its max and the load needs more (or no count meets the SLO)


@dataclass(frozen=True)
class Decision:
    at: float  # the clock the decider was given (time.time() in the runner)
    load: Load | None  # the predicted load it sized for
    sizing: Sizing | None
    roles: dict[str, RoleDecision] = field(default_factory=dict)

    @property
    def desired(self) -> dict[str, int]:
        return {role: d.desired for role, d in self.roles.items()}

    @property
    def reason(self) -> str:
        return "; ".join(f"{role}: {d.reason}" for role, d in self.roles.items())


class Decider:
    def __init__(self, profile: Profile, params: SizingParams):
        self.profile = profile
        self.params = params
        self._last_change: dict[str, float] = {}

    def decide(self, load: Load | None, current: dict[str, int], now: float,
               missed: dict[str, float] | None = None) -> Decision:
        """`missed`: role -> the observed p90 of its SLO (prefill: TTFT, decode: ITL) in the interval just ended,
        for the roles whose SLO it missed: such a role gets one replica more than it has (if the profile says it
        needs no more) and does not scale down: the feedback for a profile that flatters the fleet."""
        sizing = size(load, self.profile, self.params) if load is not None else None
        roles = {}
        for role in ROLES:
            d = self._role(role, sizing, current[role], now, (missed or {}).get(role))
            hi = self.params.max_replicas[role]
            short = sizing is not None and d.desired == hi and (d.needed is None or d.needed > hi
                                                                or (missed or {}).get(role) is not None)
            roles[role] = replace(d, short_at_max=short)
        for role, d in roles.items():
            if d.action != "hold":
                self._last_change[role] = now
        return Decision(now, load, sizing, roles)

    def _role(self, role: str, sizing: Sizing | None, current: int, now: float,
              missed_p90: float | None) -> RoleDecision:
        lo, hi = self.params.min_replicas[role], self.params.max_replicas[role]
        if current < lo or current > hi:
            target = min(hi, max(lo, current))
            return _move(role, current, None, target, f"{current} outside [{lo}, {hi}]: to {target}")
        if sizing is None:
            return RoleDecision(role, current, None, current, "hold", "no load observed yet")
        needed = sizing.needed(role, self.params.scale_up_utilization)
        what = _demand_text(role, sizing)
        if needed is None:
            slo = "TTFT" if role == "prefill" else "ITL"
            if current == hi:
                return RoleDecision(role, current, None, hi, "hold", f"{slo} SLO unreachable by one replica ({what}); at max {hi}")
            return self._up(role, current, None, hi, f"{slo} SLO unreachable by one replica ({what}): to max {hi}", now)
        target = min(hi, max(lo, needed))
        if missed_p90 is not None and target <= current:
            slo = "TTFT" if role == "prefill" else "ITL"
            if current >= hi:
                return RoleDecision(role, current, needed, current, "hold",
                                    f"observed {slo} p90 {missed_p90:.3f}s over the SLO; at max {hi}")
            return self._up(role, current, needed, current + 1, f"{what} needs {needed}, but observed {slo} p90 "
                            f"{missed_p90:.3f}s is over the SLO: up {current} -> {current + 1}", now)
        if target > current:
            return self._up(role, current, needed, target, f"{what} needs {needed}: up {current} -> {target}", now)
        if needed > hi:
            return RoleDecision(role, current, needed, current, "hold", f"{what} needs {needed}; at max {hi}")
        if target == current:
            return RoleDecision(role, current, needed, current, "hold", f"{what} needs {needed}: hold {current}")
        u = self.params.scale_down_utilization
        at_threshold = sizing.needed(role, u)
        down = min(current, max(lo, hi if at_threshold is None else at_threshold))
        if down >= current:
            return RoleDecision(role, current, needed, current, "hold",
                                f"{what} needs {needed}, but {current - 1} would run above {u:.0%}: hold {current}")
        since = now - self._last_change.get(role, -math.inf)
        if since < self.params.down_cooldown_s:
            return RoleDecision(role, current, needed, current, "hold", f"{what} needs {needed}: down to {down} "
                                f"in cooldown ({since:.0f}s of {self.params.down_cooldown_s:.0f}s)")
        return _move(role, current, needed, down, f"{what} needs {needed}: down {current} -> {down} "
                     f"(at most {u:.0%} busy)")

    def _up(self, role: str, current: int, needed: int | None, target: int, reason: str, now: float) -> RoleDecision:
        since = now - self._last_change.get(role, -math.inf)
        if since < self.params.up_cooldown_s:
            return RoleDecision(role, current, needed, current, "hold",
                                f"{reason} in cooldown ({since:.0f}s of {self.params.up_cooldown_s:.0f}s)")
        return _move(role, current, needed, target, reason)


def _move(role: str, current: int, needed: int | None, target: int, reason: str) -> RoleDecision:
    action = "up" if target > current else "down" if target < current else "hold"
    return RoleDecision(role, current, needed, target, action, reason)


def _demand_text(role: str, s: Sizing) -> str:
    if role == "prefill":
        return (f"{s.prefill_demand:.0f} uncached tok/s at {s.prefill.prompt_tokens:.0f} tok/prompt, "
                f"{s.prefill.tokens_per_s:.0f} tok/s per replica")
    return (f"{s.decode_demand:.1f} streams at {s.decode.context_tokens:.0f} tok context, "
            f"{s.decode.streams} per replica")
