"""The chart's store-memory node (`pdorch store-memory`): on by default exactly when the planner scales the
workers (planner.enabled with the kubernetes actuator), then the workers are pure store clients
(config.store.global_segment_size_mb rendered 0); its pod runs `pdorch store-memory` with the release's
config, is restricted, carries no API token, and the workers' NetworkPolicy admits it."""

from __future__ import annotations

import yaml

from tests.fixtures.chart import FULLNAME, containers, find, lint, render_chart, workloads
from tests.fixtures.pod_security import restricted_violations

MEMORY = f"{FULLNAME}-store-memory"
PROFILE = '{"version": 1, "model": "m", "device": "cpu", "created": "2026-01-01T00:00:00Z", "prefill": [], "decode": []}'


def _planner(actuator: str) -> dict:
    return {"planner": {"enabled": True, "actuator": actuator, "profile": {"json": PROFILE}}}


def _store(objs: list[dict]) -> dict:
    return yaml.safe_load(find(objs, "ConfigMap", f"{FULLNAME}-config")["data"]["config.yaml"])["store"]


def test_off_by_default_and_the_workers_keep_their_segments():
    objs = render_chart({})
    assert "store-memory" not in workloads(objs)
    assert _store(objs)["global_segment_size_mb"] == 512


def test_on_with_the_kubernetes_planner_and_the_workers_become_pure_clients():
    objs = render_chart(_planner("kubernetes"))
    node = find(objs, "Deployment", MEMORY)
    c = containers(node)[0]
    assert c["command"] == ["pdorch", "store-memory", "--config", "/etc/pdorch/config.yaml", "--port", "50181"]
    assert c["ports"] == [{"name": "rpc", "containerPort": 50181, "protocol": "TCP"}]
    assert {"name": "PDORCH_STORE_LOCAL_HOSTNAME", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in c["env"]
    pod = node["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert restricted_violations(pod) == []
    store = _store(objs)
    assert store["global_segment_size_mb"] == 0 and store["memory_node_segment_mb"] == 1024
    assert store["master_address"] == f"{FULLNAME}-master:50151"


def test_the_values_turn_it_on_or_off_whatever_the_planner():
    assert "store-memory" not in workloads(render_chart(_planner("external")))
    off = render_chart({**_planner("kubernetes"), "storeMemory": {"enabled": False}})
    assert "store-memory" not in workloads(off) and _store(off)["global_segment_size_mb"] == 512
    on = render_chart({"storeMemory": {"enabled": True, "replicas": 2},
                       "config": {"store": {"memory_node_segment_mb": 4096}}})
    assert find(on, "Deployment", MEMORY)["spec"]["replicas"] == 2
    assert _store(on)["memory_node_segment_mb"] == 4096 and _store(on)["global_segment_size_mb"] == 0


def test_no_node_without_the_store():
    objs = render_chart({**_planner("kubernetes"), "config": {"store": {"enabled": False}}})
    assert "store-memory" not in workloads(objs)


def test_its_segment_size_rolls_it_only_and_the_workers_policy_admits_it():
    a = find(render_chart(_planner("kubernetes")), "Deployment", MEMORY)
    b = find(render_chart({**_planner("kubernetes"), "config": {"store": {"memory_node_segment_mb": 2048}}}),
             "Deployment", MEMORY)
    checksum = lambda d: d["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    assert checksum(a) != checksum(b)
    workers = [find(render_chart({**_planner("kubernetes"), "config": {"store": {"memory_node_segment_mb": mb}}}),
                    "Deployment", f"{FULLNAME}-prefill") for mb in (1024, 2048)]
    assert checksum(workers[0]) == checksum(workers[1])  # the workers do not read it: they do not roll
    objs = render_chart({**_planner("kubernetes"), "networkPolicy": {"enabled": True}})
    policy = find(objs, "NetworkPolicy", f"{FULLNAME}-workers")
    components = next(e for e in policy["spec"]["podSelector"]["matchExpressions"]
                      if e["key"] == "app.kubernetes.io/component")
    assert "store-memory" in components["values"]


def test_lint_passes_with_it_on():
    report = lint({**_planner("kubernetes"), "storeMemory": {"replicas": 2}})
    assert report["errors"] == [], report
