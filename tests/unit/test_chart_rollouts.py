"""What an upgrade rolls, on rendered objects: a component's pods change when what it reads changes
(its config keys, its Secret keys) and only then; rollout strategies, disruption budgets, grace
periods that cover a drain, the router's preStop, etcd's refusals."""

from __future__ import annotations

import dataclasses
import functools
import json

import pytest
from helm_python import HelmRenderError

from pdorch.config import Config
from pdorch.config_values import field_default, field_kind
from tests.fixtures.chart import FULLNAME, containers, find, lint, render_chart, workloads

COMPONENTS = {"router", "prefill", "decode", "master", "etcd"}
WORKERS = {"prefill", "decode"}
# Keys the chart sets itself (listen hosts, addresses, discovery, secrets from env): a value there
# is overwritten, so changing it changes nothing.
DERIVED = {"prefill.host", "decode.host", "prefill.tp_size", "decode.tp_size", "router.host", "router.api_key", "router.admin_key",
           "router.previous_api_key", "grpc.token", "grpc.previous_token", "discovery.mode",
           "discovery.etcd_endpoints", "store.master_address", "store.metadata_server", "store.master_metrics_port",
           "store.local_hostname", "grpc.tls", "grpc.tls_cert", "grpc.tls_key", "grpc.tls_ca", "grpc.tls_server_name"}
MASTER_FLAGS = {"store.master_eviction_high_watermark", "store.master_eviction_ratio", "store.master_kv_lease_ttl_ms",
                "store.master_client_ttl_s", "store.master_enable_offload", "store.master_rpc_port"}


def _who_reads(key: str) -> set[str]:
    """The components whose code reads `key` (the spec this file holds the chart to)."""
    section = key.split(".")[0]
    if key in MASTER_FLAGS:
        return {"master"}
    if key == "store.ssd_path":
        return {"master"} | WORKERS  # the workers' offload directory, and it turns the master's offload on
    if key == "store.master_cluster_id":
        return {"master"} | WORKERS  # its --cluster_id, and the leader's key in etcd the workers read
    if key == "store.enabled":
        return {"master", "router"} | WORKERS
    if key in ("store.protocol", "store.device_name"):
        return {"router"} | WORKERS  # the router's POST /flush_cache?store=true is a store client too
    if key == "decode.offload_generated_kv":
        return {"router", "decode"}  # mid-stream failover's `auto`
    if key == "store.memory_node_segment_mb":
        return set()  # the store-memory node's, off by default (test_chart_store_memory.py has it on)
    return {"model": {"router"} | WORKERS, "store": WORKERS, "prefill": {"prefill"}, "decode": {"decode"},
            "router": {"router"}, "grpc": {"router"} | WORKERS, "discovery": {"router"} | WORKERS,
            "observability": {"router"} | WORKERS,  # every component traces (pdorch/tracing/)
            "planner": set()}[section]  # the planner is off by default (test_chart_planner.py has it on)


@functools.lru_cache(maxsize=8)
def _templates_of(values_json: str) -> dict[str, str]:
    objs = render_chart(json.loads(values_json))
    return {c: json.dumps(w["spec"]["template"], sort_keys=True) for c, w in workloads(objs).items()}


def _templates(values: dict) -> dict[str, str]:
    return _templates_of(json.dumps(values, sort_keys=True))


def _rolled(change: dict, base: dict | None = None) -> set[str]:
    before, after = _templates(base or {}), _templates(_merge(base or {}, change))
    assert set(before) == COMPONENTS
    return {c for c in before if before[c] != after[c]}


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _other_value(f: dataclasses.Field, kind, default):
    """A valid value different from the default."""
    meta = f.metadata
    if "choices" in meta:
        return next(c for c in meta["choices"] if c != default)
    if kind is bool:
        return not default
    if kind is int:
        return default - 1 if meta.get("max") is not None and default + 1 > meta["max"] else default + 1
    if kind is float:
        new = default * 0.9 if meta.get("max") is not None and default * 1.1 > meta["max"] else default * 1.1
        return round(max(new, meta.get("min") or 0.0) if new != default else default + 0.01, 4)
    if kind == "list":
        return {"host:port": ["10.0.0.9:2379"], "device": ["cuda:1"],
                "http_url": ["http://10.0.0.9:9090/metrics"]}.get(meta.get("format"), ["x"])
    if meta.get("format") == "abspath":
        return "/var/lib/pdorch-changed"
    if meta.get("format") == "http_url":
        return "http://10.0.0.9:4317"
    return "cuda" if meta.get("format") == "device" else f"{default}-changed"


def _keys():
    for section in dataclasses.fields(Config):
        cls = section.default_factory
        for f in dataclasses.fields(cls):
            if f"{section.name}.{f.name}" not in DERIVED:
                yield section.name, f, field_kind(f, cls), field_default(f)


# evict_low_watermark is checked against evict_high_watermark: keep the pair valid
VALID_WITH = {"store.evict_high_watermark": {"evict_low_watermark": 0.5}}
CASES = [pytest.param(s, f, k, d, id=f"{s}.{f.name}") for s, f, k, d in _keys()]


@pytest.mark.parametrize("section, field, kind, default", CASES)
def test_a_config_key_rolls_exactly_the_components_that_read_it(section, field, kind, default):
    key = f"{section}.{field.name}"
    change = {section: {field.name: _other_value(field, kind, default), **VALID_WITH.get(key, {})}}
    assert _rolled({"config": change}) == _who_reads(key), key


@pytest.mark.parametrize("key, rolls", [
    ("apiKey", {"router"}), ("adminKey", {"router"}), ("previousApiKey", {"router"}),
    ("grpcToken", {"router"} | WORKERS), ("grpcPreviousToken", {"router"} | WORKERS)])
def test_a_secret_key_rolls_the_pods_that_read_it(key, rolls):
    """Before, no Secret change rolled anything: a revoked key kept working, a new token split the fleet."""
    assert _rolled({"auth": {key: "changed-secret-value"}}) == rolls
    objs = render_chart({"auth": {key: "changed-secret-value"}})
    assert "changed-secret-value" not in json.dumps([o for o in objs if o["kind"] != "Secret"])


def test_the_examples_of_the_issue():
    assert _rolled({"config": {"router": {"policy": "least_load"}}}) == {"router"}
    assert _rolled({"config": {"store": {"master_eviction_ratio": 0.2}}}) == {"master"}
    assert _rolled({"config": {"prefill": {"chunk_tokens": 256}}}) == {"prefill"}
    # the pool's own values roll only that pool
    assert _rolled({"decode": {"extraEnv": [{"name": "X", "value": "1"}]}}) == {"decode"}
    # tensor-parallel ranks (the chart sets config.<role>.tp_size from them): only that pool
    assert _rolled({"prefill": {"tpSize": 2}}) == {"prefill"}
    assert _rolled({"decode": {"tpSize": 4}}) == {"decode"}
    assert _rolled({"master": {"extraArgs": ["--offloading_queue_limit=100"]}}) == {"master"}


def test_rollout_strategies_and_budgets():
    objs = render_chart({})
    w = workloads(objs)
    assert w["prefill"]["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert w["decode"]["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert w["router"]["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert w["master"]["spec"]["strategy"] == {"type": "Recreate"}
    for role in WORKERS:
        pdb = find(objs, "PodDisruptionBudget", f"{FULLNAME}-{role}")
        assert pdb["spec"]["maxUnavailable"] == 1
        assert pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == role
    # the single master's budget would block a node drain forever: a value, off by default
    assert not [o for o in objs if o["kind"] == "PodDisruptionBudget" and "master" in o["metadata"]["name"]]
    on = render_chart({"master": {"podDisruptionBudget": {"enabled": True}}})
    assert find(on, "PodDisruptionBudget", f"{FULLNAME}-master")["spec"]["minAvailable"] == 1


def test_grace_periods_cover_the_drains_and_the_router_has_a_prestop():
    w = workloads(render_chart({}))
    spec = {c: o["spec"]["template"]["spec"] for c, o in w.items()}
    router = containers(w["router"])[0]
    sleep = int(router["lifecycle"]["preStop"]["exec"]["command"][1])
    assert router["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep" and sleep >= 5
    assert spec["router"]["terminationGracePeriodSeconds"] >= sleep + 600  # streams last up to 600 s
    assert spec["decode"]["terminationGracePeriodSeconds"] >= 30 + 5 + 20  # drain, write-back, hand-off
    assert spec["prefill"]["terminationGracePeriodSeconds"] >= 10 + 10 + 5
    with pytest.raises(HelmRenderError, match=r"router.terminationGracePeriodSeconds \(60\) must cover"):
        render_chart({"router": {"terminationGracePeriodSeconds": 60}})
    with pytest.raises(HelmRenderError, match=r"decode.terminationGracePeriodSeconds \(40\) must cover"):
        render_chart({"decode": {"terminationGracePeriodSeconds": 40}})
    with pytest.raises(HelmRenderError, match=r"prefill.terminationGracePeriodSeconds \(30\) must cover "
                       r"config.prefill.drain_timeout_s \(10\) plus config.prefill.drain_writeback_s \(20\)"):
        render_chart({"config": {"prefill": {"drain_writeback_s": 20}}})
    ok = render_chart({"decode": {"terminationGracePeriodSeconds": 40}, "config": {"decode": {"drain_timeout_s": 5}}})
    assert workloads(ok)["decode"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 40


def test_etcd_refuses_three_members_without_persistence():
    """A member restarted without its data dir cannot rejoin ("has already been bootstrapped")."""
    with pytest.raises(HelmRenderError, match=r"etcd.replicas: 3 needs etcd.persistence.enabled"):
        render_chart({"etcd": {"replicas": 3, "persistence": {"enabled": False}}})
    objs = render_chart({"etcd": {"replicas": 3}})  # persistence empty: on with more than one member
    sts = find(objs, "StatefulSet", f"{FULLNAME}-etcd")
    assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "8Gi"
    assert "data" not in [v["name"] for v in sts["spec"]["template"]["spec"]["volumes"]]  # not an emptyDir
    anti = sts["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    term = anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "rel"
    assert find(objs, "PodDisruptionBudget", f"{FULLNAME}-etcd")["spec"] == {
        "maxUnavailable": 1, "selector": sts["spec"]["selector"]}  # one member at a time: 2 of 3 keep quorum
    single = render_chart({})
    assert not [o for o in single if o["kind"] == "PodDisruptionBudget" and o["metadata"]["name"].endswith("etcd")]
    assert "volumeClaimTemplates" not in find(single, "StatefulSet", f"{FULLNAME}-etcd")["spec"]


def _etcd_flags(objs) -> dict[str, str]:
    command = containers(find(objs, "StatefulSet", f"{FULLNAME}-etcd"))[0]["command"]
    return dict(arg[2:].split("=", 1) for arg in command[1:])


def test_etcd_compacts_and_has_a_quota_from_values():
    flags = _etcd_flags(render_chart({}))
    assert (flags["auto-compaction-mode"], flags["auto-compaction-retention"]) == ("periodic", "1h")
    assert flags["quota-backend-bytes"] == str(2 << 30)
    flags = _etcd_flags(render_chart({"etcd": {"autoCompactionMode": "revision", "autoCompactionRetention": 1000,
                                               "quotaBackendBytes": 8 << 30}}))
    assert (flags["auto-compaction-mode"], flags["auto-compaction-retention"]) == ("revision", "1000")
    assert flags["quota-backend-bytes"] == str(8 << 30)


def test_ha_masters_get_three_persistent_etcd_members_by_default():
    objs = render_chart({"master": {"replicas": 2}})
    sts = find(objs, "StatefulSet", f"{FULLNAME}-etcd")
    assert sts["spec"]["replicas"] == 3 and sts["spec"]["volumeClaimTemplates"]
    peers = _etcd_flags(objs)["initial-cluster"].split(",")
    assert [p.split("=")[0] for p in peers] == [f"{FULLNAME}-etcd-{i}" for i in range(3)]
    assert find(objs, "PodDisruptionBudget", f"{FULLNAME}-etcd")["spec"]["maxUnavailable"] == 1
    lint_report = lint({"master": {"replicas": 2}})
    assert lint_report["errors"] == [], lint_report
    assert find(render_chart({}), "StatefulSet", f"{FULLNAME}-etcd")["spec"]["replicas"] == 1  # one master: 1


def test_ha_masters_on_one_etcd_member_are_refused_naming_both_keys_unless_allowed():
    with pytest.raises(HelmRenderError, match=r"master.replicas: 2 \(HA masters\) with etcd.replicas: 1.*"
                                              r"etcd.allowSingleMember: true"):
        render_chart({"master": {"replicas": 2}, "etcd": {"replicas": 1}})
    objs = render_chart({"master": {"replicas": 2}, "etcd": {"replicas": 1, "allowSingleMember": True}})
    assert find(objs, "StatefulSet", f"{FULLNAME}-etcd")["spec"]["replicas"] == 1
    assert find(objs, "Deployment", f"{FULLNAME}-master")["spec"]["replicas"] == 2
    # an external etcd's size is the operator's: nothing to count
    render_chart({"master": {"replicas": 2}, "etcd": {"enabled": False, "externalEndpoints": ["e1:2379"]}})


def test_etcd_image_needs_a_tag():
    with pytest.raises(HelmRenderError, match="etcd.image.tag: give the etcd version"):
        render_chart({"etcd": {"image": {"repository": "gcr.io/etcd-development/etcd"}}})
    objs = render_chart({"etcd": {"image": {"repository": "gcr.io/etcd-development/etcd", "tag": "v3.5.17"}}})
    assert containers(find(objs, "StatefulSet", f"{FULLNAME}-etcd"))[0]["image"] == \
        "gcr.io/etcd-development/etcd:v3.5.17"
