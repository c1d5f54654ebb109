"""The SSD tier's volume (prefill/decode.ssdVolume), rendered by the real Helm engine: mounted at
config.store.ssd_path in the worker pods for each type, absent with the tier off, the chart's refusals
(a type without ssd_path, a sizeLimit below ssd_capacity_gb or above the ephemeral-storage limit) and
the schema's."""

from __future__ import annotations

import json

import kubernetes_validate
import pytest
from helm_python import HelmRenderError, HelmValuesError

from tests.fixtures.chart import containers, render_chart, variant_values, workloads
from tests.fixtures.pod_security import restricted_violations

K8S_VERSION = "1.34.0"
WORKERS = ("prefill", "decode")
SSD_PATH = "/var/lib/pdorch-ssd"


def _with_ssd(**pools) -> dict:
    """Values with the tier on and each named pool's ssdVolume."""
    values: dict = {"config": {"store": {"ssd_path": SSD_PATH}}}
    values.update({role: {"ssdVolume": volume} for role, volume in pools.items()})
    return values


def _ssd(workload: dict) -> tuple[list[dict], list[dict]]:
    """The workload's volumes and its first container's mounts named ssd."""
    spec = workload["spec"]["template"]["spec"]
    mounts = containers(workload)[0]["volumeMounts"]
    return [v for v in spec["volumes"] if v["name"] == "ssd"], [m for m in mounts if m["name"] == "ssd"]


def test_no_volume_when_the_tier_is_off():
    # a volume configured but no ssd_path: nothing, and no pod gets one by default either
    for values in ({}, {"prefill": {"ssdVolume": {"hostPath": {"path": "/mnt/nvme"}}}}):
        for component, workload in workloads(render_chart(values)).items():
            assert _ssd(workload) == ([], []), component


@pytest.mark.parametrize("volume, expect", [
    ({}, {"emptyDir": {}}),  # empty type: an emptyDir, as documented
    ({"type": "emptyDir", "emptyDir": {"sizeLimit": "50Gi"}}, {"emptyDir": {"sizeLimit": "50Gi"}}),
    ({"type": "emptyDir", "emptyDir": {"sizeLimit": "2Gi", "medium": "Memory"}},
     {"emptyDir": {"sizeLimit": "2Gi", "medium": "Memory"}}),
    ({"type": "hostPath", "hostPath": {"path": "/mnt/nvme0/pdorch"}},
     {"hostPath": {"path": "/mnt/nvme0/pdorch", "type": "DirectoryOrCreate"}}),
    ({"type": "hostPath", "hostPath": {"path": "/mnt/nvme0/pdorch", "type": "Directory"}},
     {"hostPath": {"path": "/mnt/nvme0/pdorch", "type": "Directory"}}),
    ({"type": "pvc", "pvc": {"claimName": "pdorch-ssd"}}, {"persistentVolumeClaim": {"claimName": "pdorch-ssd"}}),
], ids=["default", "emptyDir", "emptyDir-memory", "hostPath", "hostPath-directory", "pvc"])
def test_each_type_is_mounted_at_ssd_path_in_both_workers(volume, expect):
    sized = {"resources": {"limits": {"ephemeral-storage": "64Gi"}}}  # holds the 50Gi emptyDir
    values = _with_ssd(prefill=volume, decode=volume)
    for role in WORKERS:
        values[role].update(sized)
    w = workloads(render_chart(values))
    for role in WORKERS:
        volumes, mounts = _ssd(w[role])
        assert volumes == [{"name": "ssd", **expect}], role
        assert mounts == [{"name": "ssd", "mountPath": SSD_PATH}], role
        kubernetes_validate.validate(w[role], K8S_VERSION, strict=True)
    for component in ("router", "master", "etcd"):
        assert _ssd(w[component]) == ([], []), component


def test_each_pool_takes_its_own_volume():
    w = workloads(render_chart(_with_ssd(prefill={"type": "hostPath", "hostPath": {"path": "/mnt/nvme"}})))
    assert _ssd(w["prefill"])[0] == [{"name": "ssd", "hostPath": {"path": "/mnt/nvme", "type": "DirectoryOrCreate"}}]
    assert _ssd(w["decode"])[0] == [{"name": "ssd", "emptyDir": {}}]


def test_emptydir_and_pvc_keep_pod_security_restricted_hostpath_does_not():
    w = workloads(render_chart(_with_ssd(decode={"type": "pvc", "pvc": {"claimName": "c"}})))
    for role in WORKERS:
        assert restricted_violations(w[role]["spec"]["template"]["spec"]) == [], role
    w = workloads(render_chart(_with_ssd(prefill={"type": "hostPath", "hostPath": {"path": "/mnt/nvme"}})))
    assert any("hostPath" in v for v in restricted_violations(w["prefill"]["spec"]["template"]["spec"]))


def test_a_mount_of_the_pools_own_at_ssd_path_takes_the_charts_place():
    """e.g. a generic ephemeral volume (a per-pod claim of a local-disk StorageClass, with a Deployment)."""
    own = {"name": "nvme", "ephemeral": {"volumeClaimTemplate": {"spec": {
        "accessModes": ["ReadWriteOnce"], "storageClassName": "local-nvme", "resources": {"requests": {"storage": "200Gi"}}}}}}
    values = _with_ssd()
    values["decode"] = {"extraVolumes": [own], "extraVolumeMounts": [{"name": "nvme", "mountPath": SSD_PATH + "/"}]}
    w = workloads(render_chart(values))
    assert _ssd(w["decode"]) == ([], [])
    assert [m["mountPath"] for m in containers(w["decode"])[0]["volumeMounts"]].count(SSD_PATH + "/") == 1
    kubernetes_validate.validate(w["decode"], K8S_VERSION, strict=True)
    assert _ssd(w["prefill"])[0] == [{"name": "ssd", "emptyDir": {}}]


@pytest.mark.parametrize("role, type_", [("prefill", "emptyDir"), ("decode", "hostPath"), ("decode", "pvc")])
def test_a_type_without_ssd_path_is_refused(role, type_):
    volume = {"type": type_, "hostPath": {"path": "/mnt/nvme"}, "pvc": {"claimName": "c"}}
    with pytest.raises(HelmRenderError, match=rf"{role}\.ssdVolume\.type is {type_} but config\.store\.ssd_path is empty"):
        render_chart({role: {"ssdVolume": volume}})


@pytest.mark.parametrize("path", ["var/lib/ssd", "/var/lib/../ssd"])
def test_a_relative_ssd_path_is_refused_by_the_schema(path):
    with pytest.raises(HelmValuesError, match="/config/store/ssd_path"):
        render_chart({"config": {"store": {"ssd_path": path}}})


@pytest.mark.parametrize("volume, where", [
    ({"type": "local"}, "/prefill/ssdVolume/type"),
    ({"type": "hostPath"}, "/prefill/ssdVolume/hostPath/path"),
    ({"type": "hostPath", "hostPath": {"path": "mnt/nvme"}}, "/prefill/ssdVolume/hostPath/path"),
    ({"type": "hostPath", "hostPath": {"path": "/mnt/nvme", "type": "File"}}, "/prefill/ssdVolume/hostPath/type"),
    ({"type": "pvc"}, "/prefill/ssdVolume/pvc/claimName"),
    ({"type": "pvc", "pvc": {"claimName": ""}}, "/prefill/ssdVolume/pvc/claimName"),
    ({"emptyDir": {"sizeLimit": "lots"}}, "/prefill/ssdVolume/emptyDir/sizeLimit"),
    ({"emptyDir": {"sizeLimit": "1e9"}}, "/prefill/ssdVolume/emptyDir/sizeLimit"),
    ({"emptyDir": {"medium": "HugePages"}}, "/prefill/ssdVolume/emptyDir/medium"),
    ({"size": "10Gi"}, "additional properties 'size'"),
])
def test_the_schema_refuses_bad_volumes(volume, where):
    with pytest.raises(HelmValuesError, match=where):
        render_chart(_with_ssd(prefill=volume))


def test_a_size_limit_below_the_capacity_is_refused():
    values = _with_ssd(decode={"emptyDir": {"sizeLimit": "3Gi"}})
    values["config"]["store"]["ssd_capacity_gb"] = 3.5
    with pytest.raises(HelmRenderError, match=r"decode\.ssdVolume\.emptyDir\.sizeLimit \(3Gi\) is smaller than "
                                              r"config\.store\.ssd_capacity_gb \(3\.5 GiB\)"):
        render_chart(values)
    values["config"]["store"]["ssd_capacity_gb"] = 3  # equal: holds it
    assert _ssd(workloads(render_chart(values))["decode"])[0] == [{"name": "ssd", "emptyDir": {"sizeLimit": "3Gi"}}]
    values["decode"]["ssdVolume"]["emptyDir"]["sizeLimit"] = "3000M"  # decimal units: 2.79 GiB
    with pytest.raises(HelmRenderError, match=r"sizeLimit \(3000M\) is smaller"):
        render_chart(values)


def test_a_size_limit_above_the_ephemeral_storage_limit_is_refused():
    values = _with_ssd(prefill={"emptyDir": {"sizeLimit": "5Gi"}})  # the default limit: 4Gi
    with pytest.raises(HelmRenderError, match=r"prefill\.ssdVolume\.emptyDir\.sizeLimit \(5Gi\) is larger than "
                                              r"prefill\.resources\.limits\.ephemeral-storage \(4Gi\)"):
        render_chart(values)
    # in memory it counts in the pod's memory, not its ephemeral storage
    values["prefill"]["ssdVolume"]["emptyDir"]["medium"] = "Memory"
    assert _ssd(workloads(render_chart(values))["prefill"])[0][0]["emptyDir"]["medium"] == "Memory"
    # a limit in bytes (a number) is read too
    values = _with_ssd(prefill={"emptyDir": {"sizeLimit": "5Gi"}})
    values["prefill"]["resources"] = {"limits": {"ephemeral-storage": 6 * 2**30}}
    assert _ssd(workloads(render_chart(values))["prefill"])[0][0]["emptyDir"] == {"sizeLimit": "5Gi"}


def test_an_ssd_volume_change_rolls_only_its_pool():
    def templates(values):
        return {c: json.dumps(w["spec"]["template"], sort_keys=True) for c, w in workloads(render_chart(values)).items()}
    before = templates(_with_ssd())
    after = templates(_with_ssd(decode={"type": "pvc", "pvc": {"claimName": "c"}}))
    assert {c for c in before if before[c] != after[c]} == {"decode"}


def test_the_ssd_example_renders():
    w = workloads(render_chart(variant_values("ssd")))
    assert _ssd(w["prefill"]) == ([{"name": "ssd", "hostPath": {"path": "/mnt/nvme0/pdorch", "type": "DirectoryOrCreate"}}],
                                  [{"name": "ssd", "mountPath": SSD_PATH}])
    assert _ssd(w["decode"]) == ([{"name": "ssd", "emptyDir": {"sizeLimit": "110Gi"}}],
                                 [{"name": "ssd", "mountPath": SSD_PATH}])
