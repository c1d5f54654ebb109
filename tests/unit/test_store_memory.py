"""The store-memory node's command line from the config (pdorch/store_memory.py): what `pdorch serve
--autoscale` starts and `pdorch store-memory` execs."""

from __future__ import annotations

from pdorch.config_loader import load_config
from pdorch.store_memory import memory_node_argv, memory_node_spec, memory_node_wanted, run_store_memory


def _cfg(**sets):
    return load_config(None, {f"store.{k}": v for k, v in sets.items()}, environ={})


def test_a_single_master_and_its_http_metadata_server():
    cfg = _cfg(master_address="10.0.0.5:50151", metadata_server="http://10.0.0.5:8180/metadata",
               memory_node_segment_mb=2048, local_hostname="10.0.0.9")
    assert memory_node_argv(cfg, "/bin/mooncake_client", 50181) == (
        "/bin/mooncake_client", "--global_segment_size=2048MB", "--master_server_address=10.0.0.5:50151",
        "--metadata_server=http://10.0.0.5:8180/metadata", "--protocol=tcp", "--host=10.0.0.9", "--port=50181")


def test_masters_in_ha_mode_and_rdma():
    cfg = _cfg(master_address="etcd://e1:2379;etcd://e2:2379", metadata_server="etcd://e1:2379;etcd://e2:2379",
               protocol="rdma", device_name="mlx5_0")
    argv = memory_node_argv(cfg, "mooncake_client", 1)
    assert "--master_server_address=etcd://e1:2379;e2:2379" in argv
    assert "--metadata_server=etcd://e1:2379;e2:2379" in argv
    assert "--protocol=rdma" in argv and argv[-1] == "--device_names=mlx5_0"


def test_serve_starts_one_only_with_autoscale_the_store_and_a_segment():
    assert memory_node_wanted(_cfg(), autoscale=True)
    assert not memory_node_wanted(_cfg(), autoscale=False)
    assert not memory_node_wanted(_cfg(memory_node_segment_mb=0), autoscale=True)
    assert not memory_node_wanted(_cfg(enabled=False), autoscale=True)
    spec = memory_node_spec(_cfg(), "mooncake_client", 40000)
    assert (spec.name, spec.role, spec.ports) == ("store-memory", "store-memory", (("mooncake_client --port", 40000),))


def test_the_command_refuses_no_segment(capsys):
    assert run_store_memory(_cfg(memory_node_segment_mb=0), 50181, print_only=True) == 2
    assert "store.memory_node_segment_mb" in capsys.readouterr().err
    assert run_store_memory(_cfg(), 50181, print_only=True) == 0
    assert "--global_segment_size=1024MB" in capsys.readouterr().out
