"""`pdorch master`: the mooncake_master command line comes from the config's store.* keys."""

from __future__ import annotations

import subprocess
import sys

from pdorch.config_loader import load_config
from pdorch.master_cmd import master_process


def _flags(argv: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in argv[1:])


def test_flags_follow_store_keys():
    cfg = load_config(None, {"store.master_address": "pd-master:7001",
                             "store.metadata_server": "http://pd-master:7002/metadata",
                             "store.master_metrics_port": "7003", "store.master_eviction_high_watermark": "0.8",
                             "store.master_eviction_ratio": "0.2", "store.master_kv_lease_ttl_ms": "2500",
                             "store.master_client_ttl_s": "30", "store.master_enable_offload": "true"})
    flags = _flags(master_process(cfg, bind_host="0.0.0.0").command())
    assert (flags["rpc_port"], flags["http_metadata_server_port"], flags["metrics_port"]) == ("7001", "7002", "7003")
    assert flags["http_metadata_server_host"] == flags["metrics_host"] == "0.0.0.0"
    assert flags["eviction_high_watermark_ratio"] == "0.8" and flags["eviction_ratio"] == "0.2"
    assert flags["default_kv_lease_ttl"] == "2500" and flags["client_ttl"] == "30"
    assert flags["enable_offload"] == "true" and flags["enable_http_metadata_server"] == "true"


def test_cli_prints_command_and_refuses_without_store():
    out = subprocess.run([sys.executable, "-m", "pdorch.cli", "master", "--print", "--set",
                          "store.master_eviction_ratio=0.3"], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert "mooncake_master" in out.stdout and "--eviction_ratio=0.3" in out.stdout
    off = subprocess.run([sys.executable, "-m", "pdorch.cli", "master", "--set", "store.enabled=false"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert off.returncode == 2 and "store.enabled is false" in off.stderr
    bad = subprocess.run([sys.executable, "-m", "pdorch.cli", "master", "--print", "--set",
                          "store.metadata_server=etcd://x:1"], capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "store.metadata_server" in bad.stderr


def _master(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pdorch.cli", "master", *args], capture_output=True, text=True,
                          timeout=60, check=False)


def test_flags_pdorch_does_not_know_go_to_mooncake_master():
    """The chart's `master.extraArgs` example: before, `pdorch master` exited 2 "unrecognized arguments"."""
    out = _master("--print", "--offloading_queue_limit=100", "--", "--offload_force_evict=true", "-v", "1")
    assert out.returncode == 0, out.stderr
    printed = out.stdout.split()
    assert printed[-4:] == ["--offloading_queue_limit=100", "--offload_force_evict=true", "-v", "1"]
    assert "--eviction_ratio=0.05" in printed  # pdorch's own flags are still there, before


def test_flags_pdorch_sets_itself_or_non_flags_are_refused():
    own = _master("--print", "--rpc_port=1234")
    assert own.returncode == 2 and "--rpc_port is set from the config: set store.master_address" in own.stderr
    stray = _master("--print", "--", "stray")
    assert stray.returncode == 2 and "'stray' is not a mooncake_master flag" in stray.stderr
    # pdorch's own options keep their meaning and typos of them still fail the same way as before
    typo = _master("--print", "--set", "store.no_such_key=1")
    assert typo.returncode != 0 and "no_such_key" in typo.stderr


def test_ha_masters_run_against_the_etcd_of_store_master_address():
    ha = ["--set", "store.master_address=etcd://10.0.0.1:2379;etcd://10.0.0.2:2379", "--set",
          "store.metadata_server=etcd://10.0.0.1:2379", "--set", "store.local_hostname=10.1.2.3", "--set",
          "store.master_rpc_port=50200"]
    out = _master("--print", *ha)
    assert out.returncode == 0, out.stderr
    flags = out.stdout.split()
    for flag in ("--enable_ha=true", "--etcd_endpoints=10.0.0.1:2379;10.0.0.2:2379", "--rpc_address=10.1.2.3",
                 "--rpc_port=50200", "--enable_oplog=true", "--enable_http_metadata_server=false",
                 "--cluster_id=mooncake_cluster"):
        assert flag in flags, (flag, flags)
    http = _master("--print", "--set", "store.master_address=etcd://10.0.0.1:2379")
    assert http.returncode == 2 and "store.metadata_server" in http.stderr and "etcd://" in http.stderr
    dead = _master("--set", "store.master_address=etcd://127.0.0.1:1", "--set", "store.metadata_server=etcd://127.0.0.1:1")
    assert dead.returncode == 2 and "store.master_address: no etcd endpoint" in dead.stderr
    own = _master("--print", *ha, "--enable_ha=false")
    assert own.returncode == 2 and "set store.master_address" in own.stderr
