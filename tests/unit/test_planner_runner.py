"""PlannerRunner: one step = observe -> predict -> decide -> act (or not, in dry-run), logged and exported."""

import json
import logging
import socket
import urllib.request

from prometheus_client import CollectorRegistry

from pdorch.config_loader import load_config
from pdorch.planner.external import ExternalActuator
from pdorch.planner.observation import Observation
from pdorch.planner.predictor import MovingAverageTrend
from pdorch.planner.runner import PlannerRunner
from tests.unit.test_planner_capacity import PROFILE, SLO_RHO_HALF

# 100 requests in 10 s of 2048-token prompts, half cached, 100 output tokens: the load of test_planner_decide
# (prefill needs 5, decode 8 at ITL 0.09).
OBSERVED = Observation(interval_s=10.0, requests=100, prompt_tokens=204800, output_tokens=10000,
                       cached_tokens_by_tier={"device": 102400}, ttft_p90_s=0.5, itl_p90_s=0.2)


class Canned:
    """An observer returning the same observation (a fake of the scrape only)."""

    def __init__(self, obs):
        self.obs = obs

    def observe(self):
        return self.obs


def runner(mode: str, port: int = 0):
    cfg = load_config(None, {"planner.mode": mode, "planner.ttft_p90_s": str(SLO_RHO_HALF),
                             "planner.itl_p90_s": "0.09", "planner.max_decode": "6", "planner.max_prefill": "10",
                             "planner.metrics_port": str(port), "planner.interval_s": "1",
                             "decode.max_running_requests": "64"})
    registry = CollectorRegistry()
    actuator = ExternalActuator(registry, {"prefill": 1, "decode": 1})
    return PlannerRunner(cfg, Canned(OBSERVED), MovingAverageTrend(2), actuator, PROFILE, registry), registry


def value(registry, name, **labels):
    return registry.get_sample_value(name, labels)


def test_act_applies_and_exports_the_decision(caplog):
    r, reg = runner("act")
    with caplog.at_level(logging.INFO, logger="pdorch.planner"):
        d = r.step()
    assert d.desired == {"prefill": 5, "decode": 6}
    assert r.actuator.current() == {"prefill": 5, "decode": 6}
    assert value(reg, "pdorch_planner_external_desired_replicas", role="prefill") == 5
    assert value(reg, "pdorch_planner_desired_replicas", role="decode") == 6
    assert value(reg, "pdorch_planner_current_replicas", role="decode") == 1
    assert value(reg, "pdorch_planner_decisions_total", role="prefill", action="up") == 1
    assert value(reg, "pdorch_planner_slo_miss_at_max", role="decode") == 1  # needs 8, max 6
    assert value(reg, "pdorch_planner_slo_attainment", slo="ttft") == 1.0  # observed 0.5 s within SLO
    assert value(reg, "pdorch_planner_slo_attainment", slo="itl") == 0.0  # observed 0.2 s over 0.09
    line = next(rec.getMessage() for rec in caplog.records if rec.getMessage().startswith("planner decision "))
    logged = json.loads(line.removeprefix("planner decision "))
    assert logged["acted"] is True and logged["desired"] == {"prefill": 5, "decode": 6}
    assert "needs 5: up 1 -> 5" in logged["reason"] and logged["predicted"]["request_rate"] == 10.0
    assert logged["observed"]["obs_ttft_p90_s"] == 0.5


def test_dry_run_decides_but_changes_nothing():
    r, reg = runner("dry-run")
    d = r.step()
    assert d.desired == {"prefill": 5, "decode": 6}
    assert r.actuator.current() == {"prefill": 1, "decode": 1}
    assert value(reg, "pdorch_planner_external_desired_replicas", role="prefill") == 1
    assert value(reg, "pdorch_planner_desired_replicas", role="prefill") == 5


def test_thread_and_metrics_port_are_owned_and_stopped():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r, _ = runner("act", port)
    r.start()
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert "pdorch_planner_last_decision_timestamp_seconds" in text
    finally:
        assert r.stop(timeout_s=5)
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1)
        raise AssertionError("the metrics server still answers after stop()")
    except OSError:
        pass
