"""charts/pdorch rendered by the real Helm engine: lint, Kubernetes schemas, and what the objects say."""

from __future__ import annotations

import base64
import json
import re

import kubernetes_validate
import pytest
import yaml

from pdorch.config_loader import load_config
from tests.fixtures.chart import (
    CHART_DIR,
    FULLNAME,
    NAMESPACE,
    VARIANTS,
    containers,
    find,
    lint,
    render_chart,
    variant_values,
)

K8S_VERSION = "1.34.0"
ALL_VARIANTS = ["default", *VARIANTS]
WORKLOADS = ("Deployment", "StatefulSet")


@pytest.fixture(scope="module")
def rendered():
    return {name: render_chart(variant_values(name)) for name in ALL_VARIANTS}


def test_variants_present():
    assert {"gpu", "gpu-rdma", "external-etcd", "monitoring"} <= set(VARIANTS)


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_helm_lint_passes(variant):
    report = lint(variant_values(variant))
    assert report["errors"] == [], report
    assert not [m for m in report["messages"] if m["severity"] >= 2], report["messages"]


@pytest.mark.parametrize("values, where", [
    ({"prefill": {"replicas": -1}}, "/prefill/replicas"),
    ({"decode": {"replicas": -3}}, "/decode/replicas"),
    ({"config": {"router": {"policy": "random"}}}, "/config/router/policy"),
    ({"config": {"router": {"polcy": "least_load"}}}, "polcy"),
    ({"config": {"store": {"protocol": "udp"}}}, "/config/store/protocol"),
])
def test_bad_values_fail_through_the_schema(values, where):
    from helm_python import HelmValuesError
    report = lint(values)
    assert any(where in e for e in report["errors"]), report
    with pytest.raises(HelmValuesError, match=where):
        render_chart(values)


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_objects_validate_against_kubernetes_schemas(rendered, variant):
    kinds = set()
    for obj in rendered[variant]:
        kinds.add(obj["kind"])
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            _check_prometheus_operator_object(obj)  # a CRD: not part of Kubernetes' own OpenAPI
            continue
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    assert {"Deployment", "Service", "ConfigMap"} <= kinds


def _check_prometheus_operator_object(obj: dict) -> None:
    spec = obj["spec"]
    if obj["kind"] == "ServiceMonitor":
        assert set(spec) <= {"selector", "namespaceSelector", "endpoints"}
        assert spec["selector"]["matchLabels"] and spec["endpoints"]
        for ep in spec["endpoints"]:
            assert set(ep) <= {"port", "path", "interval"} and isinstance(ep["port"], str)
    else:
        assert obj["kind"] == "PrometheusRule"
        for group in spec["groups"]:
            for rule in group["rules"]:
                assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}
                assert rule["alert"] and rule["expr"].count("(") == rule["expr"].count(")")


def test_replica_counts(rendered):
    objs = rendered["gpu-rdma"]
    assert find(objs, "Deployment", f"{FULLNAME}-prefill")["spec"]["replicas"] == 4
    assert find(objs, "Deployment", f"{FULLNAME}-decode")["spec"]["replicas"] == 2
    assert find(objs, "Deployment", f"{FULLNAME}-router")["spec"]["replicas"] == 1
    assert find(objs, "Deployment", f"{FULLNAME}-master")["spec"]["replicas"] == 1
    assert find(rendered["default"], "StatefulSet", f"{FULLNAME}-etcd")["spec"]["replicas"] == 1
    # with the HPA on, the HPA owns the router's replica count
    mon = rendered["monitoring"]
    assert "replicas" not in find(mon, "Deployment", f"{FULLNAME}-router")["spec"]
    assert find(mon, "HorizontalPodAutoscaler", f"{FULLNAME}-router")["spec"]["minReplicas"] == 2


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_every_service_port_matches_a_container_port(rendered, variant):
    objs = rendered[variant]
    services = [o for o in objs if o["kind"] == "Service"]
    assert services
    for svc in services:
        selector = svc["spec"]["selector"]
        pods = [o for o in objs if o["kind"] in WORKLOADS
                and selector.items() <= o["spec"]["template"]["metadata"]["labels"].items()]
        assert pods, f"Service {svc['metadata']['name']} selects no workload"
        for pod in pods:
            ports = {p["name"]: p["containerPort"] for c in containers(pod) for p in c["ports"]}
            for sp in svc["spec"]["ports"]:
                target = sp["targetPort"]
                assert target in ports, f"{svc['metadata']['name']}: targetPort {target} not in {ports}"
                if svc["spec"].get("clusterIP") == "None":  # headless: clients dial the pod port itself
                    assert sp["port"] == ports[target]


def test_probes(rendered):
    objs = rendered["default"]
    router = containers(find(objs, "Deployment", f"{FULLNAME}-router"))[0]
    assert router["readinessProbe"]["httpGet"]["path"] == "/health"
    # liveness must not depend on workers or on model loading: a startup probe gates it
    assert "httpGet" not in router["livenessProbe"] and router["startupProbe"]
    for role in ("prefill", "decode"):
        c = containers(find(objs, "Deployment", f"{FULLNAME}-{role}"))[0]
        startup = c["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # a model load fits
        assert c["readinessProbe"] and c["livenessProbe"]


def test_gpu_rdma_resources(rendered):
    objs = rendered["gpu-rdma"]
    for role, page, size in (("prefill", "2Mi", "17Gi"), ("decode", "1Gi", "17Gi")):
        c = containers(find(objs, "Deployment", f"{FULLNAME}-{role}"))[0]
        for part in ("requests", "limits"):
            res = c["resources"][part]
            assert res["nvidia.com/gpu"] == 1 and res["rdma/hca_shared_devices_a"] == 1
            assert res[f"hugepages-{page}"] == size
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
        assert c["resources"]["requests"]["memory"] == "64Gi"
        env = {e["name"]: e.get("value") for e in c["env"]}  # Mooncake takes huge pages only when told
        assert env["MC_STORE_USE_HUGEPAGE"] == "1" and env["MC_STORE_HUGEPAGE_SIZE"] == {"2Mi": "2MB", "1Gi": "1GB"}[page]
    plain = containers(find(rendered["default"], "Deployment", f"{FULLNAME}-prefill"))[0]
    assert plain["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert "nvidia.com/gpu" not in plain["resources"].get("limits", {})
    assert "MC_STORE_USE_HUGEPAGE" not in {e["name"] for e in plain["env"]}


def test_rdma_without_rdma_protocol_is_refused():
    with pytest.raises(Exception, match="config.store.protocol: rdma"):
        render_chart({"prefill": {"rdma": {"enabled": True}}})


def test_pods_advertise_their_own_ip(rendered):
    for role in ("prefill", "decode", "router", "master"):
        c = containers(find(rendered["default"], "Deployment", f"{FULLNAME}-{role}"))[0]
        env = {e["name"]: e for e in c["env"]}
        assert env["PDORCH_STORE_LOCAL_HOSTNAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


def test_secret_is_referenced_never_inlined(rendered):
    objs = rendered["monitoring"]
    secret = find(objs, "Secret", f"{FULLNAME}-keys")
    assert base64.b64decode(secret["data"]["api-key"]).decode() == "test-api-key-123"
    everything_else = json.dumps([o for o in objs if o is not secret])
    assert "test-api-key-123" not in everything_else and "test-admin-key-456" not in everything_else
    env = {e["name"]: e for e in containers(find(objs, "Deployment", f"{FULLNAME}-router"))[0]["env"]}
    ref = env["PDORCH_ROUTER_API_KEY"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": f"{FULLNAME}-keys", "key": "api-key"}
    for role in ("prefill", "decode", "master"):  # only the router gets keys
        names = {e["name"] for e in containers(find(objs, "Deployment", f"{FULLNAME}-{role}"))[0]["env"]}
        assert not {"PDORCH_ROUTER_API_KEY", "PDORCH_ROUTER_ADMIN_KEY"} & names
    # an existing Secret: referenced by name, none created
    ext = rendered["external-etcd"]
    assert not [o for o in ext if o["kind"] == "Secret"]
    env = {e["name"]: e for e in containers(find(ext, "Deployment", f"{FULLNAME}-router"))[0]["env"]}
    assert env["PDORCH_ROUTER_ADMIN_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "pdorch-keys"


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_configmap_parses_with_pdorch_loader(rendered, variant, tmp_path):
    cm = find(rendered[variant], "ConfigMap", f"{FULLNAME}-config")
    path = tmp_path / "config.yaml"
    path.write_text(cm["data"]["config.yaml"])
    cfg = load_config(path, environ={"PDORCH_STORE_LOCAL_HOSTNAME": "10.1.2.3"})
    assert cfg.discovery.mode == "etcd" and cfg.store.local_hostname == "10.1.2.3"
    assert cfg.prefill.host == cfg.decode.host == cfg.router.host == "0.0.0.0"
    assert cfg.router.api_key == "" and cfg.router.admin_key == ""
    if variant == "external-etcd":
        assert cfg.discovery.etcd_endpoints[0] == "etcd-0.etcd.infra.svc:2379"
        assert cfg.discovery.cluster == "pdorch-prod"
        assert not [o for o in rendered[variant] if o["kind"] == "StatefulSet"]
    else:
        assert cfg.discovery.etcd_endpoints == (f"{FULLNAME}-etcd:2379",)
        find(rendered[variant], "StatefulSet", f"{FULLNAME}-etcd")
    if variant == "ha-masters":
        assert cfg.store.master_address == cfg.store.metadata_server == f"etcd://{FULLNAME}-etcd:2379"
    else:
        assert cfg.store.master_address == f"{FULLNAME}-master:50151"
    if variant == "gpu-rdma":
        assert (cfg.store.protocol, cfg.model.device) == ("rdma", "cuda")


def test_containers_mount_the_configmap(rendered):
    for obj in rendered["default"]:
        if obj["kind"] == "Deployment":
            c = containers(obj)[0]
            assert "/etc/pdorch/config.yaml" in c["command"]
            assert {"name": "config", "mountPath": "/etc/pdorch", "readOnly": True} in c["volumeMounts"]


def test_master_flags_come_from_values():
    objs = render_chart({"config": {"store": {"master_eviction_high_watermark": 0.7, "master_kv_lease_ttl_ms": 3000}},
                         "master": {"extraArgs": ["--offloading_queue_limit=100"]}})
    master = containers(find(objs, "Deployment", f"{FULLNAME}-master"))[0]
    assert master["command"][:2] == ["pdorch", "master"] and master["args"] == ["--", "--offloading_queue_limit=100"]
    cfg = yaml.safe_load(find(objs, "ConfigMap", f"{FULLNAME}-config")["data"]["config.yaml"])
    assert cfg["store"]["master_eviction_high_watermark"] == 0.7 and cfg["store"]["master_kv_lease_ttl_ms"] == 3000


def test_monitoring_objects(rendered):
    objs = rendered["monitoring"]
    dash = find(objs, "ConfigMap", f"{FULLNAME}-dashboard")
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    panels = json.loads(dash["data"]["pdorch.json"])["panels"]
    titles = " ".join(p["title"] for p in panels).lower()
    for what in ("first token", "inter-token", "hit rate", "store bytes", "transfer", "queues", "evictions",
                 "workers healthy", "failovers", "pool usage", "errors", "preemptions", "desired vs current replicas",
                 "slo attainment", "last decision", "drains"):
        assert what in titles
    board = json.loads(dash["data"]["pdorch.json"])
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert "namespace" in variables["namespace"]["definition"]
    for panel in panels:  # every series of every panel is the chosen namespace's only
        for target in panel["targets"]:
            selectors = re.findall(r"\b(?:pdorch|master)_[a-z0-9_]+(\{[^}]*\})?", target["expr"])
            assert selectors and all('namespace=~"$namespace"' in sel for sel in selectors), target["expr"]
    rules = find(objs, "PrometheusRule", FULLNAME)["spec"]["groups"][0]["rules"]
    assert {r["alert"] for r in rules} == {
        "PdorchTargetDown", "PdorchTargetAbsent", "PdorchNoHealthyWorkers", "PdorchErrorRatioHigh",
        "PdorchFailoversFailing", "PdorchFencePagesHeld", "PdorchMasterEvictionStorm", "PdorchHitRateDropped",
        "PdorchStoreDisabled", "PdorchQueueDepthHigh", "PdorchTTFTP99High", "PdorchPreemptionsHigh",
        "PdorchStoreNoMasterLeads", "PdorchSloMissAtMaxReplicas"}
    assert all(r["annotations"]["runbook"] for r in rules)
    assert all(f'namespace="{NAMESPACE}"' in r["expr"] for r in rules)
    assert [o for o in objs if o["kind"] == "NetworkPolicy"]
    assert not [o for o in rendered["default"] if o["kind"] in ("NetworkPolicy", "ServiceMonitor")]


def test_worker_grpc_token_and_tls():
    objs = render_chart({"auth": {"grpcToken": "tok-789"}, "grpcTls": {"enabled": True, "secretName": "pd-tls",
                                                                        "serverName": "workers.pd"}})
    assert "tok-789" not in json.dumps([o for o in objs if o["kind"] != "Secret"])
    cfg = yaml.safe_load(find(objs, "ConfigMap", f"{FULLNAME}-config")["data"]["config.yaml"])
    assert cfg["grpc"] == {"token": "", "previous_token": "", "tls": True, "tls_cert": "/etc/pdorch-tls/tls.crt",
                           "tls_key": "/etc/pdorch-tls/tls.key", "tls_ca": "/etc/pdorch-tls/ca.crt",
                           "tls_server_name": "workers.pd"}
    for role in ("router", "prefill", "decode"):
        obj = find(objs, "Deployment", f"{FULLNAME}-{role}")
        c = containers(obj)[0]
        env = {e["name"]: e for e in c["env"]}
        assert env["PDORCH_GRPC_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "grpc-token"
        assert {"name": "grpc-tls", "mountPath": "/etc/pdorch-tls", "readOnly": True} in c["volumeMounts"]
        vols = {v["name"]: v for v in obj["spec"]["template"]["spec"]["volumes"]}
        assert vols["grpc-tls"]["secret"]["secretName"] == "pd-tls"
    master_env = {e["name"] for e in containers(find(objs, "Deployment", f"{FULLNAME}-master"))[0]["env"]}
    assert "PDORCH_GRPC_TOKEN" not in master_env
    for obj in objs:
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            continue
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_every_values_key_is_commented():
    """values.yaml: a comment above (or beside) every key, as operators read it instead of docs."""
    lines = (CHART_DIR / "values.yaml").read_text().splitlines()
    missing = []
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "-")) or ":" not in stripped:
            continue
        above = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        # a block of sub-keys opened by a commented parent counts as documented by their own comments
        if not (above.startswith("#") or "#" in line):
            missing.append(f"line {i + 1}: {stripped}")
    assert not missing, "values.yaml keys without a comment:\n" + "\n".join(missing)


def test_ha_masters_elect_in_etcd_roll_one_at_a_time_and_are_probed_on_metrics(rendered):
    objs = rendered["ha-masters"]
    master = find(objs, "Deployment", f"{FULLNAME}-master")
    assert master["spec"]["replicas"] == 2
    assert master["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    c = containers(master)[0]
    assert [p["name"] for p in c["ports"]] == ["rpc", "metrics"]  # the metadata is in etcd
    assert c["startupProbe"]["tcpSocket"]["port"] == c["livenessProbe"]["tcpSocket"]["port"] == "metrics"
    assert find(objs, "PodDisruptionBudget", f"{FULLNAME}-master")["spec"]["minAvailable"] == 1
    assert not [o for o in rendered["default"] if o["kind"] == "PodDisruptionBudget" and "master" in o["metadata"]["name"]]
    cfg = yaml.safe_load(find(objs, "ConfigMap", f"{FULLNAME}-config")["data"]["config.yaml"])["store"]
    assert cfg["master_rpc_port"] == 50151 and cfg["master_metrics_port"] == 9103
    external = render_chart({"master": {"replicas": 3}, "etcd": {"enabled": False, "externalEndpoints": ["e1:2379", "e2:2379"]}})
    store = yaml.safe_load(find(external, "ConfigMap", f"{FULLNAME}-config")["data"]["config.yaml"])["store"]
    assert store["master_address"] == store["metadata_server"] == "etcd://e1:2379;etcd://e2:2379"
    assert find(external, "Deployment", f"{FULLNAME}-master")["spec"]["replicas"] == 3


def test_ha_masters_without_etcd_are_refused_naming_the_keys():
    with pytest.raises(Exception, match=r"master.replicas >= 2 .*etcd.enabled or etcd.externalEndpoints"):
        render_chart({"master": {"replicas": 2}, "etcd": {"enabled": False}})
