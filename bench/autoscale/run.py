"""The comparison: every fixed fleet (P, D) within the bounds against the planner, on the same arrivals.

The planner is the real `PlannerRunner` (predictor, decide, metrics), its observer fed each simulated interval's
Observation and its actuator the simulated fleet, so the bench runs the same decide code as `pdorch planner`.
The oracle is that runner with a predictor told the true load of the coming intervals (oracle.py): the cost and
attainment a perfect forecast would reach under the same decide rules.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import numpy as np

from bench.autoscale.arrivals import Shape, generate
from bench.autoscale.oracle import Oracle, true_loads
from bench.autoscale.sim import simulate
from bench.autoscale.world import World
from pdorch.config_loader import load_config
from pdorch.planner.profile import load_profile
from pdorch.planner.runner import PlannerRunner
from pdorch.planner.upper_bound import UpperBound, horizon_intervals, predictor_from_config

PROFILE_PATH = Path(__file__).with_name("profile.json")
ATTAINMENT_GOAL = 0.95
COST_GOAL = 0.7
PLANNER_KEYS = ("interval_s", "scale_up_utilization", "scale_down_utilization", "replica_startup_s", "load_margin", "error_window",
                "predictor_window", "up_cooldown_s", "down_cooldown_s")


def _planner(cfg, predictor, profile):
    """The scaler simulate() calls each interval: the real PlannerRunner, its observer handed the interval."""
    observer = _Handed()
    box: dict = {}

    def plan(k, observation, fleet):
        if "runner" not in box:
            box["runner"] = PlannerRunner(cfg, observer, predictor, fleet, profile, clock=lambda: fleet.now)
        observer.next = observation
        box["runner"].step()

    return plan


class _Handed:
    """The planner's observer: returns the observation the simulation hands it."""

    def __init__(self):
        self.next = None

    def observe(self):
        return self.next


def planner_config(max_prefill: int, max_decode: int, interval_s: float, startup_s: float, ttft_s: float,
                   itl_s: float, overrides: dict[str, str] | None = None):
    """The planner's config in the bench: the simulation's SLOs, bounds and start-up; `overrides`: planner.* keys."""
    # the bench's planner settings: it decides every 10 s (a third of the SLO interval, so a burst's onset is
    # answered up to 20 s sooner), looks back 90 s (predictor_window 9) and takes its forecast errors over 5 min
    # (error_window 30), the same spans as 3 and 10 intervals of 30 s; with decisions that frequent the headroom
    # of scale_up_utilization < 1 is no longer needed, and a scale-down may follow 30 s after a change
    return load_config(None, {
        "planner.mode": "act", "planner.interval_s": str(interval_s / 3), "planner.ttft_p90_s": str(ttft_s),
        "planner.itl_p90_s": str(itl_s), "planner.max_prefill": str(max_prefill),
        "planner.max_decode": str(max_decode), "planner.up_cooldown_s": str(interval_s),
        "planner.down_cooldown_s": str(interval_s), "planner.predictor_window": "9", "planner.error_window": "30",
        "planner.scale_up_utilization": "1", "planner.replica_startup_s": str(startup_s),
        "planner.metrics_port": "0", **(overrides or {})})


def compare(shape: Shape, max_prefill: int, max_decode: int, interval_s: float = 30.0, step_s: float = 1.0,
            startup_s: float = 30.0, ttft_s: float = 1.5, itl_s: float = 0.1,
            planner_overrides: dict[str, str] | None = None, profile_path: Path = PROFILE_PATH) -> dict:
    profile = load_profile(profile_path)
    world = World(profile)
    requests = generate(shape)
    slo = {"ttft": ttft_s, "itl": itl_s}

    def summary(results, cost, **extra) -> dict:
        met = sum(r.met for r in results) / len(results)
        return {**extra, "slo_met_fraction": round(met, 4), "replica_seconds": round(cost, 1)}

    fixed = []
    for p in range(1, max_prefill + 1):
        for d in range(1, max_decode + 1):
            results, cost = simulate(requests, world, lambda *_: None, {"prefill": p, "decode": d}, interval_s,
                                     step_s, startup_s, slo)
            fixed.append(summary(results, cost, prefill=p, decode=d))
    cfg = planner_config(max_prefill, max_decode, interval_s, startup_s, ttft_s, itl_s, planner_overrides)
    # the planner decides every planner.interval_s (its own interval, which may be shorter than the SLO interval)
    decide_s = cfg.planner.interval_s
    decisions = int(np.ceil(requests[-1].arrival_s / interval_s) * round(interval_s / decide_s)) if requests else 0
    # the oracle: the same runner told the coming decision intervals' true load (oracle.py), no margin over it
    oracle_cfg = replace(cfg, planner=replace(cfg.planner, load_margin=0.0))
    runs = {"planner": (cfg, predictor_from_config(cfg)),
            "oracle": (oracle_cfg, UpperBound(Oracle(true_loads(requests, decide_s, decisions)),
                                              horizon_intervals(startup_s, decide_s), 0.0, 1))}
    out = {}
    for name, (c, predictor) in runs.items():
        results, cost = simulate(requests, world, _planner(c, predictor, profile), {"prefill": 1, "decode": 1},
                                 interval_s, step_s, startup_s, slo, decide_s)
        changes = sum(a.replicas != b.replicas for a, b in itertools.pairwise(results))
        out[name] = summary(results, cost, fleet_changes=changes, missed=[k for k, r in enumerate(results) if not r.met],
                            replicas_max={r: max(x.replicas[r] for x in results) for r in ("prefill", "decode")})
    planner = out["planner"]
    meeting = [f for f in fixed if f["slo_met_fraction"] >= ATTAINMENT_GOAL]
    smallest = min(meeting, key=lambda f: f["replica_seconds"]) if meeting else None
    ratio = round(planner["replica_seconds"] / smallest["replica_seconds"], 3) if smallest else None
    return {"requests": len(requests), "intervals": len(results), "shape": vars(shape),
            "planner_keys": {k: getattr(cfg.planner, k) for k in PLANNER_KEYS},
            "sim": {"interval_s": interval_s, "planner_interval_s": decide_s, "step_s": step_s, "startup_s": startup_s, "slo": slo,
                    "profile": profile_path.name},
            "fixed": fixed, "smallest_fixed_meeting_slo": smallest, "planner": planner,
            "planner_cost_ratio": ratio, "oracle": out["oracle"],
            "oracle_cost_ratio": round(out["oracle"]["replica_seconds"] / smallest["replica_seconds"], 3)
            if smallest else None,
            "goal": {"slo_met_fraction": ATTAINMENT_GOAL, "cost_ratio": COST_GOAL,
                     "met": bool(ratio is not None and ratio <= COST_GOAL
                                 and planner["slo_met_fraction"] >= ATTAINMENT_GOAL)}}
