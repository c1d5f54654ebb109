"""`pdorch planner`: the planner on its own (a Deployment in the chart, or next to any fleet), until SIGTERM.

The actuator comes from planner.actuator: kubernetes or external. local is refused here: it starts and stops
worker processes of the cluster `pdorch serve --autoscale` runs, and exists only inside it. --once: observe one
interval, print the decision as JSON and exit (acting on it only in planner.mode act).
"""

from __future__ import annotations

import json
import logging
import sys
import threading

from prometheus_client import CollectorRegistry

from pdorch.planner.profile import ProfileError
from pdorch.stop_signal import stop_on_signals, wait_for_stop


def run_planner(cfg, once: bool = False) -> int:
    p = cfg.planner
    if p.actuator == "local":
        print("pdorch planner: planner.actuator local starts and stops the worker processes of `pdorch serve "
              "--autoscale` and runs only inside it; use kubernetes or external here", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    registry = CollectorRegistry()
    try:
        runner = _runner(cfg, registry)
    except (ProfileError, ValueError) as e:
        print(f"pdorch planner: {e}", file=sys.stderr)
        return 2
    if once:
        runner.observer.observe()  # primes the counters
        threading.Event().wait(p.interval_s)
        print(json.dumps({"desired": (d := runner.step()).desired, "reason": d.reason}))
        return 0
    stop = stop_on_signals()
    runner.start()
    print(f"pdorch planner: {p.mode}, actuator {p.actuator}, every {p.interval_s:g}s", file=sys.stderr)
    wait_for_stop(stop)
    return 0 if runner.stop(timeout_s=max(10.0, 2 * p.scrape_timeout_s)) else 1


def _runner(cfg, registry):
    from pdorch.planner.runner import PlannerRunner
    p = cfg.planner
    if not p.profile_path:  # before the actuator: no API server call for a planner that cannot start
        raise ValueError("planner.profile_path is empty: profile the workers with `pdorch bench profile` and "
                         "set planner.profile_path to the file it wrote")
    if p.actuator == "kubernetes":
        from pdorch.planner.kubernetes import KubernetesActuator
        actuator = KubernetesActuator.from_config(cfg)
    else:
        from pdorch.planner.external import ExternalActuator
        actuator = ExternalActuator(registry, {"prefill": p.min_prefill, "decode": p.min_decode})
    return PlannerRunner.from_config(cfg, actuator, registry=registry)
