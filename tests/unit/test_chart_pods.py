"""The pods the chart renders: Pod Security "restricted", identity, where the model comes from, the
pools' own volumes / init containers / env sources, scheduling values, metrics ports, names."""

from __future__ import annotations

import json
import re

import kubernetes_validate
import pytest
import yaml

from pdorch.config_loader import load_config
from tests.fixtures.chart import FULLNAME, containers, find, render_chart, variant_values, workloads
from tests.fixtures.pod_security import restricted_violations

K8S_VERSION = "1.34.0"
POOLS = ("router", "prefill", "decode")
INIT_MODEL = {"modelVolume": {"type": "initContainer", "subPath": "m",
                              "initContainer": {"image": "registry.example/fetch-model:1", "args": ["--to", "$(MODEL_DIR)"]}}}


def _pods(objs):
    return {c: w["spec"]["template"]["spec"] for c, w in workloads(objs).items()}


@pytest.mark.parametrize("variant", ["default", "gpu", "external-etcd", "monitoring"])
def test_every_pod_meets_pod_security_restricted(variant):
    pods = _pods(render_chart(variant_values(variant)))
    assert pods
    for component, spec in pods.items():
        assert restricted_violations(spec) == [], component
        for c in spec["containers"] + spec.get("initContainers", []):
            assert c["securityContext"]["readOnlyRootFilesystem"] is True, (component, c["name"])


def test_restricted_with_a_model_init_container_and_3_etcd_members():
    pods = _pods(render_chart({**INIT_MODEL, "etcd": {"replicas": 3, "persistence": {"enabled": True}}}))
    for component, spec in pods.items():
        assert restricted_violations(spec) == [], component


def test_rdma_adds_ipc_lock_and_nothing_else():
    """RDMA pins memory (IPC_LOCK): restricted refuses it, and that is the only deviation."""
    pods = _pods(render_chart(variant_values("gpu-rdma")))
    for component, spec in pods.items():
        found = restricted_violations(spec)
        if component in ("prefill", "decode"):
            assert found and all("IPC_LOCK" in v for v in found), found
        else:
            assert found == [], component


def test_the_checker_catches_what_restricted_forbids():
    spec = _pods(render_chart({}))["prefill"]
    bad = json.loads(json.dumps(spec))
    c = bad["containers"][0]
    c["securityContext"]["allowPrivilegeEscalation"] = True
    c["securityContext"]["capabilities"] = {"add": ["SYS_ADMIN"]}
    bad["securityContext"].pop("runAsNonRoot")
    bad["securityContext"].pop("seccompProfile")
    bad["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    bad["hostNetwork"] = True
    found = " ".join(restricted_violations(bad))
    for words in ("allowPrivilegeEscalation", "drop: must include ALL", "SYS_ADMIN", "runAsNonRoot", "seccompProfile",
                  "hostPath", "hostNetwork"):
        assert words in found


def test_service_account_without_a_token_and_scheduling_values():
    values = {pool: {"priorityClassName": f"{pool}-prio", "runtimeClassName": f"{pool}-rt",
                     "schedulerName": f"{pool}-sched"} for pool in ("router", "prefill", "decode", "master", "etcd")}
    objs = render_chart(values)
    sa = find(objs, "ServiceAccount", FULLNAME)
    assert sa["automountServiceAccountToken"] is False
    for component, spec in _pods(objs).items():
        assert spec["serviceAccountName"] == FULLNAME and spec["automountServiceAccountToken"] is False
        assert (spec["priorityClassName"], spec["runtimeClassName"], spec["schedulerName"]) == \
            (f"{component}-prio", f"{component}-rt", f"{component}-sched")
    other = render_chart({"serviceAccount": {"create": False, "name": "shared"}})
    assert not [o for o in other if o["kind"] == "ServiceAccount"]
    assert {s["serviceAccountName"] for s in _pods(other).values()} == {"shared"}


def _cfg(objs, tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(find(objs, "ConfigMap", f"{FULLNAME}-config")["data"]["config.yaml"])
    return load_config(path, environ={"PDORCH_STORE_LOCAL_HOSTNAME": "10.1.2.3"})


@pytest.mark.parametrize("volume, expect", [
    ({"type": "pvc", "pvc": {"claimName": "models"}, "subPath": "Mistral-7B"},
     {"persistentVolumeClaim": {"claimName": "models", "readOnly": True}}),
    ({"type": "hostPath", "hostPath": {"path": "/srv/models"}}, {"hostPath": {"path": "/srv/models", "type": "Directory"}}),
    (INIT_MODEL["modelVolume"], {"emptyDir": {"sizeLimit": "64Gi"}}),
])
def test_model_volume_reaches_router_and_workers(volume, expect, tmp_path):
    objs = render_chart({"modelVolume": volume})
    model_dir = "/model" + (f"/{volume['subPath']}" if volume.get("subPath") else "")
    cfg = _cfg(objs, tmp_path)
    assert cfg.model.source == model_dir and cfg.model.cache_dir == "/var/cache/pdorch/models"
    pods = _pods(objs)
    for pool in POOLS:
        vols = {v["name"]: v for v in pods[pool]["volumes"]}
        assert {k: v for k, v in vols["model"].items() if k != "name"} == expect
        assert vols["model-cache"]["emptyDir"]  # `pdorch model prepare` links the model there: writable
        mounts = {m["name"]: m for m in pods[pool]["containers"][0]["volumeMounts"]}
        assert mounts["model"]["mountPath"] == "/model"
        assert mounts["model"].get("readOnly") == (volume["type"] != "initContainer")
        assert mounts["model-cache"]["mountPath"] == cfg.model.cache_dir
    assert "model" not in {v["name"] for v in pods["master"]["volumes"]}  # the master reads no model
    for obj in objs:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_model_init_container_runs_first_and_the_router_asks_for_the_tokenizer_only():
    pods = _pods(render_chart({**INIT_MODEL, "decode": {"initContainers": [{"name": "warm", "image": "busybox:1"}]}}))
    for pool, part in (("router", "tokenizer"), ("prefill", "weights"), ("decode", "weights")):
        init = pods[pool]["initContainers"]
        assert init[0]["name"] == "model" and init[0]["image"] == "registry.example/fetch-model:1"
        env = {e["name"]: e["value"] for e in init[0]["env"]}
        assert env["MODEL_DIR"] == "/model/m" and env["PDORCH_MODEL_PART"] == part
        assert {"name": "model", "mountPath": "/model"} in init[0]["volumeMounts"]
    assert [c["name"] for c in pods["decode"]["initContainers"]] == ["model", "warm"]  # the pool's own after
    from helm_python import HelmRenderError
    with pytest.raises(HelmRenderError, match="modelVolume.pvc.claimName"):
        render_chart({"modelVolume": {"type": "pvc"}})


def test_pools_take_their_own_volumes_mounts_init_containers_env_sources():
    extra = {"envFrom": [{"secretRef": {"name": "hub-token"}}],
             "extraVolumes": [{"name": "ssd", "emptyDir": {}}],
             "extraVolumeMounts": [{"name": "ssd", "mountPath": "/ssd"}],
             "initContainers": [{"name": "check", "image": "busybox:1", "command": ["true"]}]}
    objs = render_chart({pool: extra for pool in POOLS})
    for pool, spec in _pods(objs).items():
        if pool not in POOLS:
            continue
        c = spec["containers"][0]
        assert c["envFrom"] == extra["envFrom"]
        assert {"name": "ssd", "mountPath": "/ssd"} in c["volumeMounts"]
        assert {"name": "ssd", "emptyDir": {}} in spec["volumes"]
        assert spec["initContainers"][-1]["name"] == "check"
        assert c["resources"]["requests"]["ephemeral-storage"]  # emptyDirs and logs are counted


def test_torch_threads_follow_the_pods_cpu_request():
    """Before, torch took the node's cores (os.cpu_count() // 2), however little CPU the pod had."""
    pods = _pods(render_chart({}))
    for role in ("prefill", "decode"):
        env = {e["name"]: e for e in pods[role]["containers"][0]["env"]}
        ref = env["PDORCH_MODEL_TORCH_THREADS"]["valueFrom"]["resourceFieldRef"]
        assert ref == {"containerName": role, "resource": "requests.cpu", "divisor": "1"}
    pinned = _pods(render_chart({"config": {"model": {"torch_threads": 3}}}))  # an explicit value wins
    assert "PDORCH_MODEL_TORCH_THREADS" not in {e["name"] for e in pinned["prefill"]["containers"][0]["env"]}


def test_router_metrics_on_their_own_port_open_to_scrapers_one_servicemonitor_per_component():
    mon = variant_values("monitoring")
    objs = render_chart({**mon, "networkPolicy": {**mon["networkPolicy"],
                                                  "metricsFrom": [{"namespaceSelector": {"matchLabels": {"x": "mon"}}}]}})
    router = containers(find(objs, "Deployment", f"{FULLNAME}-router"))[0]
    assert {"name": "metrics", "containerPort": 9390, "protocol": "TCP"} in router["ports"]
    svc = find(objs, "Service", f"{FULLNAME}-router-metrics")
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["ports"][0]["targetPort"] == "metrics"
    assert [p["name"] for p in find(objs, "Service", f"{FULLNAME}-router")["spec"]["ports"]] == ["http"]
    cfg = yaml.safe_load(find(objs, "ConfigMap", f"{FULLNAME}-config")["data"]["config.yaml"])
    assert cfg["router"]["metrics_port"] == 9390
    policy = find(objs, "NetworkPolicy", f"{FULLNAME}-router")
    rules = {r["ports"][0]["port"]: r.get("from") for r in policy["spec"]["ingress"]}
    assert rules["http"] == mon["networkPolicy"]["routerFrom"]  # the API stays closed to scrapers
    assert rules["metrics"] == [{"namespaceSelector": {"matchLabels": {"x": "mon"}}}]
    for name in ("workers", "master"):
        metric_rules = [r for r in find(objs, "NetworkPolicy", f"{FULLNAME}-{name}")["spec"]["ingress"]
                        if r.get("ports", [{}])[0].get("port") == "metrics"]
        assert metric_rules[0]["from"] == rules["metrics"]
    monitors = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ServiceMonitor"}
    assert set(monitors) == {f"{FULLNAME}-{c}" for c in ("router", "prefill", "decode", "master")}
    for name, m in monitors.items():
        component = name.removeprefix(f"{FULLNAME}-")
        assert m["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == component
        assert m["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "30s"}]
        assert m["metadata"]["labels"]["release"] == "prometheus"


def test_spread_constraints_count_only_this_release_and_affinity_may_name_it():
    objs = render_chart(variant_values("gpu-rdma"))
    prefill = workloads(objs)["prefill"]["spec"]["template"]["spec"]
    sel = prefill["topologySpreadConstraints"][0]["labelSelector"]["matchLabels"]
    assert sel == {"app.kubernetes.io/name": "pdorch", "app.kubernetes.io/instance": "rel",
                   "app.kubernetes.io/component": "prefill"}
    decode = workloads(objs)["decode"]["spec"]["template"]["spec"]
    term = decode["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "rel"
    # decode pods of the GPU examples tolerate the GPU taint too (before: prefill only)
    for variant in ("gpu", "gpu-rdma"):
        for role in ("prefill", "decode"):
            spec = workloads(render_chart(variant_values(variant)))[role]["spec"]["template"]["spec"]
            assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]


def test_long_release_names_render_valid_names():
    release = "a-very-long-release-name-for-the-serving-team-prod1"  # 51 of Helm's 53 characters
    objs = render_chart({"etcd": {"replicas": 3, "persistence": {"enabled": True}}}, release=release)
    dns1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
    for obj in objs:
        name = obj["metadata"]["name"]
        assert len(name) <= 63 and dns1035.match(name), name
        if obj["kind"] == "StatefulSet":
            assert len(name) <= 52, name  # + "-" + a 10-character controller revision hash
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_router_master_and_etcd_take_the_slim_image():
    objs = render_chart({"image": {"tag": "1.2", "slimTag": "1.2-slim"}})
    images = {c: containers(w)[0]["image"] for c, w in workloads(objs).items()}
    assert images == {"router": "pdorch:1.2-slim", "master": "pdorch:1.2-slim", "etcd": "pdorch:1.2-slim",
                      "prefill": "pdorch:1.2", "decode": "pdorch:1.2"}
    assert {containers(w)[0]["image"] for w in workloads(render_chart({})).values()} == {"pdorch:0.1.0"}

