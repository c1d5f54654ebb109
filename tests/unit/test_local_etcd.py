"""The local etcd of `pdorch serve` (pdorch/local_etcd.py): when one is started, what the cluster is
pointed at, and that the command it plans starts a real etcd."""

from __future__ import annotations

import io

from pdorch.child_process import Child, stop_children
from pdorch.config_loader import default_config_path, load_config
from pdorch.launcher import LocalCluster, ServeOptions
from pdorch.local_etcd import EtcdNeeds, LocalEtcd, etcd_needs
from pdorch.local_stack.processes import wait_for_port
from pdorch.worker.registration import connect


def _cfg(**overrides):
    return load_config(default_config_path(), {k.replace("__", "."): v for k, v in overrides.items()}, environ={})


def test_needed_for_ha_masters_without_an_etcd_address_and_for_autoscale_with_static_discovery():
    assert etcd_needs(_cfg(), 1, False) == EtcdNeeds(masters=False, discovery=False)
    assert etcd_needs(_cfg(), 2, False) == EtcdNeeds(masters=True, discovery=False)
    assert etcd_needs(_cfg(), 1, True) == EtcdNeeds(masters=False, discovery=True)
    given = "etcd://127.0.0.1:2379"
    assert etcd_needs(_cfg(store__master_address=given, store__metadata_server=given), 3, False).any is False
    assert etcd_needs(_cfg(discovery__mode="etcd"), 1, True).any is False
    assert etcd_needs(_cfg(store__enabled="false"), 2, False).masters is False


def test_overrides_point_the_masters_and_discovery_at_it():
    etcd = LocalEtcd(23790, 23800, "/data")
    assert etcd.overrides(EtcdNeeds(masters=True, discovery=True)) == (
        "store.master_address=etcd://127.0.0.1:23790", "store.metadata_server=etcd://127.0.0.1:23790",
        "discovery.mode=etcd", "discovery.etcd_endpoints=127.0.0.1:23790")
    assert etcd.overrides(EtcdNeeds(masters=False, discovery=True)) == (
        "discovery.mode=etcd", "discovery.etcd_endpoints=127.0.0.1:23790")


def test_serve_with_two_masters_plans_a_local_etcd_first_and_every_child_uses_it(tmp_path):
    opts = ServeOptions(log_dir=str(tmp_path), prepare=False, num_masters=2)
    lc = LocalCluster(_cfg(), str(default_config_path()), (), opts, io.StringIO())
    plan = lc._make_plan()
    etcd = plan.children[0]
    assert (etcd.name, etcd.role) == ("etcd", "etcd")
    address = f"etcd://127.0.0.1:{etcd.ports[0][1]}"
    assert lc.cfg.store.master_address == address and lc.cfg.store.metadata_server == address
    assert [c.name for c in plan.children[1:3]] == ["master-0", "master-1"]
    assert all(f"--etcd_endpoints=127.0.0.1:{etcd.ports[0][1]}" in " ".join(c.argv) for c in plan.by_role("master"))
    for child in plan.by_role("prefill") + plan.by_role("decode") + plan.by_role("router"):
        assert f"store.master_address={address}" in child.argv, child.name
    assert str(tmp_path / "etcd-data") in etcd.argv


def test_the_planned_etcd_starts_and_answers(tmp_path):
    spec = LocalEtcd.on_free_ports(str(tmp_path / "data")).spec()
    child = Child("etcd", spec.argv, tmp_path / "etcd.log")
    child.start()
    try:
        wait_for_port(spec.ports[0][1], 20, child.proc)
        client = connect([f"127.0.0.1:{spec.ports[0][1]}"])
        client.put("/pdorch-test/k", "v")
        assert client.get("/pdorch-test/k")[0] == b"v"
        client.close()
    finally:
        assert stop_children([child], 10) == []
