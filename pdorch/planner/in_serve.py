"""The planner inside `pdorch serve --autoscale`: the same PlannerRunner as `pdorch planner`, its actuator
the LocalFleet serve made (whatever planner.actuator says: --autoscale is the local actuator), started once
the cluster is ready and stopped first when serve stops.

The profile is loaded before anything starts, so a missing or bad one is a start-up error, not a cluster
that runs and never scales. Every decision (one JSON line with its inputs and reason) goes to planner.log in
serve's log directory, next to the children's logs.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path

from pdorch.config import Config
from pdorch.planner.actuator import Actuator
from pdorch.planner.profile import Profile, load_profile

log = logging.getLogger("pdorch.planner")


def load_serve_profile(cfg: Config) -> Profile:
    """Raises ValueError (ProfileError is one) naming planner.profile_path."""
    if not cfg.planner.profile_path:
        raise ValueError("--autoscale needs planner.profile_path: profile the workers with `pdorch bench profile "
                         "--out PROFILE.json`, then --set planner.profile_path=PROFILE.json")
    return load_profile(cfg.planner.profile_path)


def planner_port_taken(cfg: Config) -> str | None:
    """The error when planner.metrics_port is in use: found before anything starts, not once the cluster runs."""
    from pdorch.serve_probes import port_in_use
    port = cfg.planner.metrics_port
    if port and port_in_use("0.0.0.0", port):
        return (f"planner.metrics_port {port} (the planner's /metrics and /status) is in use; is another pdorch "
                "serve --autoscale or pdorch planner running? --set planner.metrics_port=PORT (0: none)")
    return None


def starting_sizes(cfg: Config, prefill: int, decode: int) -> tuple[int, int]:
    """--prefill/--decode clamped to the planner's bounds: the fleet never starts outside them."""
    p = cfg.planner
    return min(max(prefill, p.min_prefill), p.max_prefill), min(max(decode, p.min_decode), p.max_decode)


def planner_starter(cfg: Config, profile: Profile, router_urls: Callable[[], list[str]], log_dir: Path):
    """`start(fleet) -> stop` for LocalCluster.attach; the planner logs to log_dir/planner.log."""
    local = dataclasses.replace(cfg, planner=dataclasses.replace(cfg.planner, actuator="local"))

    def start(fleet: Actuator) -> Callable[[], None]:
        from pdorch.planner.runner import PlannerRunner
        # NOTE: serve configures no logging (its output is the children's progress); without this handler
        # the decisions and the planner's errors would go nowhere.
        handler = logging.FileHandler(Path(log_dir) / "planner.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        runner = PlannerRunner.from_config(local, fleet, router_urls=router_urls(), profile=profile)
        runner.start()
        log.info("planner: %s with the local fleet, every %gs", local.planner.mode, local.planner.interval_s)

        def stop() -> None:
            if not runner.stop(timeout_s=max(10.0, 2 * local.planner.scrape_timeout_s)):
                log.warning("planner: its thread did not end in time")
            log.removeHandler(handler)
            handler.close()
        return stop
    return start
