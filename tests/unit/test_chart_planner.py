"""The chart's planner (`pdorch planner`): off by default; with the kubernetes actuator a ServiceAccount,
a least-privilege Role (get/patch the scale of exactly this release's prefill and decode Deployments, get
those two) and its RoleBinding; with the external actuator no Role and no API token; its profile, its
--set flags naming the release's own objects, and its metrics scraped."""

from __future__ import annotations

import pytest

from tests.fixtures.chart import (
    FULLNAME,
    NAMESPACE,
    containers,
    find,
    render_chart,
    variant_values,
    workloads,
)
from tests.fixtures.pod_security import restricted_violations

PLANNER = f"{FULLNAME}-planner"
PROFILE = '{"version": 1, "model": "m", "device": "cpu", "created": "2026-01-01T00:00:00Z", "prefill": [], "decode": []}'
RBAC_KINDS = ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")


def _planner(actuator: str = "kubernetes", **extra) -> dict:
    return {"planner": {"enabled": True, "actuator": actuator, "profile": {"json": PROFILE}, **extra}}


def _sets(objs: list[dict]) -> dict[str, str]:
    command = containers(find(objs, "Deployment", PLANNER))[0]["command"]
    assert command[:4] == ["pdorch", "planner", "--config", "/etc/pdorch/config.yaml"]
    flags = command[4:]
    assert flags[::2] == ["--set"] * (len(flags) // 2)
    return dict(s.split("=", 1) for s in flags[1::2])


def test_nothing_of_the_planner_by_default():
    objs = render_chart({})
    assert not [o for o in objs if o["kind"] in RBAC_KINDS]
    assert not [o for o in objs if o["metadata"]["labels"].get("app.kubernetes.io/component") == "planner"]
    assert not [o for o in objs if o["kind"] == "ServiceAccount" and o["metadata"]["name"] == PLANNER]


def test_the_role_is_least_privilege_for_exactly_the_two_deployments():
    objs = render_chart(variant_values("planner"))
    deployments = {o["metadata"]["name"] for o in objs if o["kind"] == "Deployment"}
    targets = [f"{FULLNAME}-prefill", f"{FULLNAME}-decode"]
    assert set(targets) <= deployments  # the names the Role grants are the chart's own Deployments
    role = find(objs, "Role", PLANNER)
    assert role["metadata"].get("namespace") in (None, NAMESPACE)
    assert role["rules"] == [
        {"apiGroups": ["apps"], "resources": ["deployments/scale"], "resourceNames": targets, "verbs": ["get", "patch"]},
        {"apiGroups": ["apps"], "resources": ["deployments"], "resourceNames": targets, "verbs": ["get"]}]
    assert [o["kind"] for o in objs if o["kind"] in RBAC_KINDS] == ["Role", "RoleBinding"]  # nothing cluster-wide
    binding = find(objs, "RoleBinding", PLANNER)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": PLANNER}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": PLANNER, "namespace": NAMESPACE}]
    assert find(objs, "ServiceAccount", PLANNER)["automountServiceAccountToken"] is True


def test_only_the_planner_pod_carries_an_api_token():
    pods = {c: w["spec"]["template"]["spec"] for c, w in workloads(render_chart(variant_values("planner"))).items()}
    assert (pods["planner"]["serviceAccountName"], pods["planner"]["automountServiceAccountToken"]) == (PLANNER, True)
    for component, spec in pods.items():
        if component != "planner":
            assert spec["serviceAccountName"] == FULLNAME and spec["automountServiceAccountToken"] is False
    assert restricted_violations(pods["planner"]) == []


def test_the_planner_is_told_the_release_names_and_its_profile():
    objs = render_chart(variant_values("planner"))
    assert _sets(objs) == {
        "planner.actuator": "kubernetes", "planner.k8s_namespace": NAMESPACE,
        "planner.k8s_prefill_deployment": f"{FULLNAME}-prefill", "planner.k8s_decode_deployment": f"{FULLNAME}-decode",
        "planner.metrics_port": "9190", "planner.profile_path": "/etc/pdorch-profile/profile.json"}
    planner = find(objs, "Deployment", PLANNER)
    assert planner["spec"]["replicas"] == 1 and planner["spec"]["strategy"] == {"type": "Recreate"}
    spec = planner["spec"]["template"]["spec"]
    assert {"name": "profile", "configMap": {"name": f"{PLANNER}-profile"}} in spec["volumes"]
    assert {"name": "profile", "mountPath": "/etc/pdorch-profile", "readOnly": True} in \
        spec["containers"][0]["volumeMounts"]
    profile = find(objs, "ConfigMap", f"{PLANNER}-profile")["data"]["profile.json"]
    assert profile.strip() == variant_values("planner")["planner"]["profile"]["json"].strip()


def test_external_actuator_has_no_role_and_no_token():
    objs = render_chart(_planner("external"))
    assert not [o for o in objs if o["kind"] in RBAC_KINDS]
    assert not [o for o in objs if o["kind"] == "ServiceAccount" and o["metadata"]["name"] == PLANNER]
    spec = find(objs, "Deployment", PLANNER)["spec"]["template"]["spec"]
    assert (spec["serviceAccountName"], spec["automountServiceAccountToken"]) == (FULLNAME, False)
    assert _sets(objs) == {"planner.actuator": "external", "planner.metrics_port": "9190",
                           "planner.profile_path": "/etc/pdorch-profile/profile.json"}
    find(objs, "Service", PLANNER)  # KEDA or an HPA reads pdorch_planner_desired_replicas there


def test_an_existing_profile_configmap():
    objs = render_chart({"planner": {"enabled": True, "profile": {"existingConfigMap": "measured", "key": "h100.json"}}})
    assert not [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == f"{PLANNER}-profile"]
    spec = find(objs, "Deployment", PLANNER)["spec"]["template"]["spec"]
    assert {"name": "profile", "configMap": {"name": "measured"}} in spec["volumes"]
    assert _sets(objs)["planner.profile_path"] == "/etc/pdorch-profile/h100.json"


def test_no_profile_is_refused_naming_the_values():
    from helm_python import HelmRenderError
    with pytest.raises(HelmRenderError, match="planner.profile.json .* or planner.profile.existingConfigMap"):
        render_chart({"planner": {"enabled": True}})


def test_bad_actuator_fails_through_the_schema():
    from helm_python import HelmValuesError
    with pytest.raises(HelmValuesError, match="/planner/actuator"):
        render_chart(_planner("local"))


def test_the_planner_is_scraped_and_reaches_the_routers_metrics():
    objs = render_chart({**_planner(), "monitoring": {"serviceMonitor": {"enabled": True}},
                         "networkPolicy": {"enabled": True, "metricsFrom": [{"namespaceSelector": {}}]}})
    monitor = find(objs, "ServiceMonitor", PLANNER)
    assert monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "planner"
    service = find(objs, "Service", PLANNER)
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9190, "targetPort": "metrics", "protocol": "TCP"}]
    metrics_rule = [r for r in find(objs, "NetworkPolicy", f"{FULLNAME}-router")["spec"]["ingress"]
                    if r["ports"] == [{"port": "metrics", "protocol": "TCP"}]]
    assert metrics_rule[0]["from"][0] == {"namespaceSelector": {}}
    assert metrics_rule[0]["from"][1]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "planner"


def test_the_target_alerts_watch_the_planner_job():
    objs = render_chart({**_planner(), "monitoring": {"serviceMonitor": {"enabled": True},
                                                      "prometheusRule": {"enabled": True}}})
    rules = {r["alert"]: r for g in find(objs, "PrometheusRule", FULLNAME)["spec"]["groups"] for r in g["rules"]}
    assert f'job="{PLANNER}"' in rules["PdorchTargetAbsent"]["expr"]
    assert PLANNER in rules["PdorchTargetDown"]["expr"]
    assert rules["PdorchSloMissAtMaxReplicas"]["for"] == "10m"


def test_the_planner_owns_the_worker_replicas_only_with_the_kubernetes_actuator():
    """A `helm upgrade` must not reset what the planner chose: with the kubernetes actuator the worker
    Deployments render no replicas; with the external one (or no planner) the values' replicas stay."""
    for role in ("prefill", "decode"):
        owned = find(render_chart(_planner()), "Deployment", f"{FULLNAME}-{role}")
        assert "replicas" not in owned["spec"]
        external = find(render_chart(_planner("external", ) | {role: {"replicas": 3}}), "Deployment", f"{FULLNAME}-{role}")
        assert external["spec"]["replicas"] == 3
