"""The chart's alerts, checked by Prometheus' own `promtool`: `check rules` on the rendered
PrometheusRule, and `test rules` with a case for each alert (it fires on the series that should fire
it, with the labels written here) and controls that must not fire (the old queue alert's false
positive, another release's pods, a router that still sees a worker).

The expected annotations are the rendered ones (promtool compares them too); what fires, when and
with which labels is written by hand below.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from tests.fixtures.chart import FULLNAME, NAMESPACE, find, render_chart, variant_values

NS = f'namespace="{NAMESPACE}"'
GEN = f'{NS}, route="/v1/chat/completions"'
JOBS = [f"{FULLNAME}-router-metrics", f"{FULLNAME}-prefill", f"{FULLNAME}-decode", f"{FULLNAME}-master"]


def _up(job: str, values: str) -> dict:
    return {"series": f'up{{{NS}, job="{job}", instance="10.0.0.1:9"}}', "values": values}


# (alert, input series, eval time, [expected labels of each firing alert])
CASES = [
    ("PdorchTargetDown", [_up(JOBS[1], "1 1 0x20"), _up(JOBS[0], "1x22"),
                          {"series": f'up{{{NS}, job="other-pdorch-prefill", instance="10.0.0.2:9"}}', "values": "0x22"}],
     "10m", [{"namespace": NAMESPACE, "job": JOBS[1], "instance": "10.0.0.1:9", "severity": "critical"}]),
    ("PdorchTargetDown", [_up(job, "1x20") for job in JOBS], "15m", []),
    ("PdorchTargetAbsent", [_up(job, "1x20") for job in JOBS[1:]], "15m",
     [{"namespace": NAMESPACE, "job": JOBS[0], "severity": "critical"}]),
    ("PdorchTargetAbsent", [_up(job, "1x20") for job in JOBS], "15m", []),
    ("PdorchNoHealthyWorkers", [{"series": f'pdorch_router_workers_healthy{{{NS}, role="decode", pod="r1"}}', "values": "1 0x10"},
                                {"series": f'pdorch_router_workers_healthy{{{NS}, role="prefill", pod="r1"}}', "values": "2x10"}],
     "5m", [{"role": "decode", "severity": "critical"}]),
    # one router of two still sees a decode worker: requests still succeed there
    ("PdorchNoHealthyWorkers", [{"series": f'pdorch_router_workers_healthy{{{NS}, role="decode", pod="r1"}}', "values": "0x10"},
                                {"series": f'pdorch_router_workers_healthy{{{NS}, role="decode", pod="r2"}}', "values": "1x10"}],
     "5m", []),
    # 503s start on a series that existed at 0 (pre-created by the router), 2 of every 12 requests
    ("PdorchErrorRatioHigh", [{"series": f'pdorch_router_requests_total{{{GEN}, status="200"}}', "values": "0+10x20"},
                              {"series": f'pdorch_router_requests_total{{{GEN}, status="503"}}', "values": "0 0 0+2x18"},
                              {"series": f'pdorch_router_requests_total{{{NS}, route="/health", status="200"}}',
                               "values": "0+1000x20"}],
     "15m", [{"severity": "warning"}]),
    # health probes are not generation requests: their 200s do not hide the 503s, nor do they count
    ("PdorchErrorRatioHigh", [{"series": f'pdorch_router_requests_total{{{GEN}, status="200"}}', "values": "0+100x20"},
                              {"series": f'pdorch_router_requests_total{{{GEN}, status="503"}}', "values": "0+1x20"}],
     "15m", []),
    ("PdorchFailoversFailing", [{"series": f'pdorch_router_failovers_total{{{NS}, outcome="failed"}}', "values": "0 0 0 1x10"},
                                {"series": f'pdorch_router_failovers_total{{{NS}, outcome="resumed"}}', "values": "0+5x13"}],
     "6m", [{"severity": "warning"}]),
    ("PdorchFailoversFailing", [{"series": f'pdorch_router_failovers_total{{{NS}, outcome="failed"}}', "values": "0x13"},
                                {"series": f'pdorch_router_failovers_total{{{NS}, outcome="resumed"}}', "values": "0+5x13"}],
     "6m", []),
    ("PdorchFencePagesHeld", [{"series": f'pdorch_decode_fence_held_pages{{{NS}, pod="d1"}}', "values": "4x20"}],
     "17m", [{"severity": "warning"}]),
    ("PdorchFencePagesHeld", [{"series": f'pdorch_decode_fence_held_pages{{{NS}, pod="d1"}}', "values": "4 0x20"}],
     "17m", []),
    # 12 preemptions a minute on one decode pod (the threshold is 6), another pod quiet
    ("PdorchPreemptionsHigh", [{"series": f'pdorch_decode_preemptions_total{{{NS}, pod="d1"}}', "values": "0+12x30"},
                               {"series": f'pdorch_decode_preemptions_total{{{NS}, pod="d2"}}', "values": "0x30"}],
     "25m", [{"pod": "d1", "severity": "warning"}]),
    # a burst of 30 then none: over within the 10 minutes
    ("PdorchPreemptionsHigh", [{"series": f'pdorch_decode_preemptions_total{{{NS}, pod="d1"}}', "values": "0 30x30"}],
     "25m", []),
    ("PdorchMasterEvictionStorm", [{"series": f'master_evicted_key_count{{{NS}, pod="m"}}', "values": "0+1800x30"}],
     "25m", [{"severity": "warning"}]),
    ("PdorchMasterEvictionStorm", [{"series": f'master_evicted_key_count{{{NS}, pod="m"}}', "values": "0+60x30"}],
     "25m", []),
    # 0.8 of prompt tokens cached for 350 minutes, then 0.1
    ("PdorchHitRateDropped", [{"series": f"pdorch_router_prompt_tokens_total{{{NS}}}", "values": "0+1000x400"},
                              {"series": f'pdorch_router_cached_tokens_total{{{NS}, tier="store"}}',
                               "values": "0+800x350 280100+100x49"}],
     "380m", [{"severity": "warning"}]),
    ("PdorchHitRateDropped", [{"series": f"pdorch_router_prompt_tokens_total{{{NS}}}", "values": "0+1000x400"},
                              {"series": f'pdorch_router_cached_tokens_total{{{NS}, tier="store"}}', "values": "0+800x400"}],
     "380m", []),
    ("PdorchStoreDisabled", [{"series": f'pdorch_store_enabled{{{NS}, pod="p1"}}', "values": "1 0x10"},
                             {"series": f'pdorch_store_enabled{{{NS}, pod="p2"}}', "values": "1x10"}],
     "8m", [{"severity": "critical"}]),
    ("PdorchStoreDisabled", [{"series": f'pdorch_store_enabled{{{NS}, pod="p1"}}', "values": "1 0 0 1x10"}],
     "8m", []),  # a reconnect within the 5 minutes
    ("PdorchStoreNoMasterLeads", [{"series": f'pdorch_store_master_leading{{{NS}, pod="p1"}}', "values": "1 0x5"},
                                  {"series": f'pdorch_store_master_leading{{{NS}, pod="d1"}}', "values": "1 0x5"}],
     "3m", [{"severity": "critical"}]),
    ("PdorchStoreNoMasterLeads", [{"series": f'pdorch_store_master_leading{{{NS}, pod="p1"}}', "values": "1 0 1x5"}],
     "3m", []),  # a switch within the minute
    ("PdorchQueueDepthHigh", [{"series": f'pdorch_decode_queue_depth{{{NS}, pod="d1"}}', "values": "100x20"},
                              {"series": f'pdorch_prefill_queue_depth{{{NS}, pod="p1"}}', "values": "0x20"}],
     "15m", [{"severity": "warning"}]),
    # a healthy router at capacity: many requests in flight, nothing queued (the old alert fired here)
    ("PdorchQueueDepthHigh", [{"series": f'pdorch_router_requests_in_flight{{{NS}, pod="r1"}}', "values": "1000x20"},
                              {"series": f'pdorch_decode_queue_depth{{{NS}, pod="d1"}}', "values": "0x20"},
                              {"series": f'pdorch_prefill_queue_depth{{{NS}, pod="p1"}}', "values": "3x20"}],
     "15m", []),
    ("PdorchTTFTP99High", [{"series": f'pdorch_router_ttft_seconds_bucket{{{NS}, route="/generate", le="{le}"}}',
                            "values": f"0+{n}x20"} for le, n in (("1.0", 0), ("10.0", 10), ("+Inf", 10))],
     "15m", [{"severity": "warning"}]),
    ("PdorchTTFTP99High", [{"series": f'pdorch_router_ttft_seconds_bucket{{{NS}, route="/generate", le="{le}"}}',
                            "values": f"0+{n}x20"} for le, n in (("1.0", 10), ("10.0", 10), ("+Inf", 10))],
     "15m", []),
    # decode at its max for 12 minutes (two planner replicas' series during a rollout), prefill never
    ("PdorchSloMissAtMaxReplicas", [{"series": f'pdorch_planner_slo_miss_at_max{{{NS}, role="decode", pod="pl1"}}',
                                     "values": "0 1x15"},
                                    {"series": f'pdorch_planner_slo_miss_at_max{{{NS}, role="decode", pod="pl2"}}',
                                     "values": "0x15"},
                                    {"series": f'pdorch_planner_slo_miss_at_max{{{NS}, role="prefill", pod="pl1"}}',
                                     "values": "0x15"}],
     "13m", [{"role": "decode", "severity": "warning"}]),
    # missed at max for 6 minutes, met for one, missed again: never 10 minutes on end
    ("PdorchSloMissAtMaxReplicas", [{"series": f'pdorch_planner_slo_miss_at_max{{{NS}, role="decode", pod="pl1"}}',
                                     "values": "1x6 0 1x8"}],
     "15m", []),
]


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool not found: `make setup` installs Debian's prometheus package, which ships it"
    return path


@pytest.fixture(scope="module")
def rules() -> dict:
    """The rendered rule groups (monitoring variant: ServiceMonitors on, so the target alerts exist)."""
    return find(render_chart(variant_values("monitoring")), "PrometheusRule", FULLNAME)["spec"]


def _run(promtool: str, *args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def _test_file(rules: dict, cases) -> dict:
    by_name = {r["alert"]: r for g in rules["groups"] for r in g["rules"]}
    tests = []
    for alert, series, at, expected in cases:
        exp = [{"exp_labels": labels, "exp_annotations": by_name[alert]["annotations"]} for labels in expected]
        tests.append({"interval": "1m", "input_series": series,
                      "alert_rule_test": [{"eval_time": at, "alertname": alert, "exp_alerts": exp}]})
    return {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}


def test_every_alert_has_a_case_that_fires_it_and_one_that_does_not(rules):
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    fired = {a for a, _, _, exp in CASES if exp}
    quiet = {a for a, _, _, exp in CASES if not exp}
    assert fired == alerts and quiet == alerts


def test_promtool_checks_the_rules_and_their_unit_tests_pass(promtool, rules, tmp_path):
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
    checked = _run(promtool, "check", "rules", "rules.yaml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {sum(len(g['rules']) for g in rules['groups'])} rules found" in checked.stdout
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(_test_file(rules, CASES), sort_keys=False))
    tested = _run(promtool, "test", "rules", "tests.yaml", cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_the_harness_fails_a_wrong_expectation(promtool, rules, tmp_path):
    """The unit tests above can fail: expecting silence where the alert fires makes promtool say so."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
    alert, series, at, _ = next(c for c in CASES if c[0] == "PdorchQueueDepthHigh" and c[3])
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(_test_file(rules, [(alert, series, at, [])])))
    tested = _run(promtool, "test", "rules", "tests.yaml", cwd=tmp_path)
    assert tested.returncode != 0 and "PdorchQueueDepthHigh" in tested.stdout + tested.stderr
