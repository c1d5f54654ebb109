"""pdorch.launch_plan: ports, argv and discovery lists of `pdorch serve --prefill N --decode M`."""

from __future__ import annotations

import pytest

from pdorch.config_loader import default_config_path, load_config
from pdorch.launch_plan import (
    PlanError,
    master_ports,
    plan_local_cluster,
    torch_threads_per_worker,
    worker_devices,
)

MASTER = ("/bin/mooncake_master", "--rpc_port=50151")


def local(**overrides):
    return load_config(default_config_path(), overrides, environ={})


def sets(argv) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]


def test_two_prefill_three_decode_ports_and_discovery():
    plan = plan_local_cluster(local(), 2, 3, "/c.yaml", ("router.policy=round_robin",), python="py",
                              master_argv=MASTER, cpu_count=10)
    assert [c.name for c in plan.children] == ["master", "prefill-0", "prefill-1", "decode-0", "decode-1",
                                               "decode-2", "router"]
    p1 = plan.by_role("prefill")[1]
    assert p1.argv[:5] == ("py", "-m", "prefill_node", "--config", "/c.yaml")
    # the user's --set first, the launcher's last (the last one wins)
    assert sets(p1.argv) == ["router.policy=round_robin", "prefill.port=50162", "prefill.metrics_port=9162",
                             "model.torch_threads=2", "model.device=cpu"]
    assert dict(plan.by_role("decode")[2].ports) == {"decode.port": 50173, "decode.metrics_port": 9173}
    assert plan.config.discovery.prefill == ("127.0.0.1:50161", "127.0.0.1:50162")
    assert plan.config.discovery.decode == ("127.0.0.1:50171", "127.0.0.1:50172", "127.0.0.1:50173")
    router = plan.by_role("router")[0]
    assert router.argv[:3] == ("py", "-m", "router")
    assert sets(router.argv) == ["router.policy=round_robin",
                                 "discovery.prefill=127.0.0.1:50161,127.0.0.1:50162",
                                 "discovery.decode=127.0.0.1:50171,127.0.0.1:50172,127.0.0.1:50173"]
    assert plan.router_url == "http://127.0.0.1:8390"
    master = plan.by_role("master")[0]
    assert master.argv == MASTER and [p for _, p in master.ports] == [50151, 8180, 9103]


def test_router_discovery_set_round_trips_through_the_loader():
    plan = plan_local_cluster(local(), 2, 1, "/c.yaml", master_argv=MASTER, cpu_count=2)
    overrides = dict(s.split("=", 1) for s in sets(plan.by_role("router")[0].argv))
    assert load_config(None, overrides, environ={}).discovery == plan.config.discovery


def test_store_off_means_no_master_and_disabled_metrics_stay_off():
    plan = plan_local_cluster(local(**{"store.enabled": "false", "prefill.metrics_port": "0"}), 2, 1, "/c.yaml",
                              cpu_count=2)
    assert [c.role for c in plan.children] == ["prefill", "prefill", "decode", "router"]
    assert all("prefill.metrics_port=0" in sets(c.argv) for c in plan.by_role("prefill"))
    assert plan.by_role("prefill")[1].ports == (("prefill.port", 50162),)


def test_etcd_mode_leaves_discovery_to_the_workers():
    cfg = local(**{"discovery.mode": "etcd"})
    plan = plan_local_cluster(cfg, 1, 1, "/c.yaml", master_argv=MASTER, cpu_count=2)
    assert not any(s.startswith("discovery.") for s in sets(plan.by_role("router")[0].argv))
    assert plan.config.discovery == cfg.discovery


def test_wildcard_listen_is_advertised_on_loopback():
    plan = plan_local_cluster(local(**{"prefill.host": "0.0.0.0", "router.host": "0.0.0.0"}), 1, 1, "/c",
                              master_argv=MASTER, cpu_count=2)
    assert plan.config.discovery.prefill == ("127.0.0.1:50161",)
    assert plan.router_url == "http://127.0.0.1:8390"


@pytest.mark.parametrize("configured, workers, cores, expected", [
    (0, 2, 2, 1), (0, 2, 8, 4), (0, 5, 2, 1), (0, 3, 8, 2), (3, 2, 2, 3)])
def test_torch_threads_divide_the_cores(configured, workers, cores, expected):
    cfg = local(**{"model.torch_threads": str(configured)})
    assert torch_threads_per_worker(cfg, workers, cores) == expected


def test_colliding_ports_are_refused_naming_the_key():
    # prefill-10 would take 50171, decode-0's port
    with pytest.raises(PlanError, match="decode.port: port 50171 of decode-0 is also prefill.port of prefill-10"):
        plan_local_cluster(local(), 11, 1, "/c.yaml", master_argv=MASTER, cpu_count=2)
    with pytest.raises(PlanError, match="router.port: port 50151"):
        plan_local_cluster(local(**{"router.port": "50151"}), 1, 1, "/c.yaml", master_argv=MASTER, cpu_count=2)


def test_bad_counts_and_ports_beyond_range():
    with pytest.raises(PlanError, match="--prefill and --decode must be >= 1"):
        plan_local_cluster(local(), 0, 1, "/c.yaml", master_argv=MASTER)
    with pytest.raises(PlanError, match="decode.port: decode-1 would need port 65536"):
        plan_local_cluster(local(**{"decode.port": "65535"}), 1, 2, "/c.yaml", master_argv=MASTER)


def test_master_ports_need_an_http_metadata_url():
    assert master_ports(local()) == ("127.0.0.1", 50151, 8180, 9103)
    with pytest.raises(PlanError, match="store.metadata_server: .*expected http://host:port/metadata"):
        master_ports(local(**{"store.metadata_server": "P2PHANDSHAKE"}))


def test_secrets_never_reach_an_argv_and_only_the_router_gets_them_by_env():
    from pdorch.launch_plan import child_env

    overrides = ("router.api_key=sk-client-123", "router.policy=round_robin", " router.admin_key =sk-admin-456",
                 "grpc.token=tok-789")
    cfg = local(**{o.split("=", 1)[0].strip(): o.split("=", 1)[1] for o in overrides})
    plan = plan_local_cluster(cfg, 2, 1, "/c.yaml", overrides, python="py", master_argv=MASTER, cpu_count=2)
    for child in plan.children:
        assert not any(s in a for a in child.argv for s in ("sk-client-123", "sk-admin-456", "tok-789")), child.name
        assert "sk-" not in repr(child) and "tok-" not in repr(child)
        assert "router.policy=round_robin" in sets(child.argv) or child.role == "master"
    router = plan.by_role("router")[0]
    assert dict(router.env) == {"PDORCH_ROUTER_API_KEY": "sk-client-123", "PDORCH_ROUTER_ADMIN_KEY": "sk-admin-456",
                                "PDORCH_GRPC_TOKEN": "tok-789"}
    # the workers get the token they check, and nothing else
    assert all(dict(c.env) == {"PDORCH_GRPC_TOKEN": "tok-789"} for c in plan.by_role("prefill") + plan.by_role("decode"))
    assert plan.by_role("master")[0].env == ()
    # the launcher's own environment may hold a key too: workers never inherit it
    inherited = {"PATH": "/bin", "PDORCH_ROUTER_API_KEY": "from-env", "PDORCH_DECODE_NUM_PAGES": "64"}
    worker_env = child_env(inherited, plan.by_role("prefill")[0])
    assert worker_env == {"PATH": "/bin", "PDORCH_DECODE_NUM_PAGES": "64", "PDORCH_GRPC_TOKEN": "tok-789"}
    assert child_env(inherited, router)["PDORCH_ROUTER_API_KEY"] == "sk-client-123"
    # what the router process reads back is the effective key
    env = child_env(inherited, router)
    assert load_config(None, {}, environ=env).router.api_key == "sk-client-123"


def test_redact_argv_hides_secret_values_only():
    from pdorch.launch_plan import redact_argv

    argv = ["py", "-m", "router", "--set", "router.api_key=sk-1", "--set=router.admin_key=a=b",
            "--set", "router.port=1", "router.api_key"]
    assert redact_argv(argv) == ["py", "-m", "router", "--set", "router.api_key=<redacted>",
                                 "--set=router.admin_key=<redacted>", "--set", "router.port=1", "router.api_key"]


def device_of(child) -> str:
    return next(s for s in sets(child.argv)[::-1] if s.startswith("model.device=")).partition("=")[2]


def test_each_local_worker_gets_its_own_gpu():
    plan = plan_local_cluster(local(**{"model.device": "cuda"}), 2, 2, "/c.yaml", master_argv=MASTER, cpu_count=8,
                              gpu_count=4)
    workers = plan.by_role("prefill") + plan.by_role("decode")
    assert [device_of(c) for c in workers] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert plan.devices == ("cuda:0", "cuda:1", "cuda:2", "cuda:3")


@pytest.mark.parametrize("overrides, gpus, expected", [
    ({"model.device": "cuda"}, 2, ["cuda:0", "cuda:1", "cuda:0"]),             # fewer GPUs: shared in turn
    ({"model.device": "cuda"}, 0, ["cuda", "cuda", "cuda"]),                   # none: the worker's check says so
    ({"model.device": "cuda:3"}, 8, ["cuda:3", "cuda:3", "cuda:3"]),           # pinned by the user
    ({"model.device": "cpu"}, 8, ["cpu", "cpu", "cpu"]),
    ({"model.device": "cuda", "model.local_devices": "cuda:6,cuda:7"}, 8, ["cuda:6", "cuda:7", "cuda:6"]),
])
def test_device_placement(overrides, gpus, expected):
    assert worker_devices(local(**overrides), [1, 1, 1], gpu_count=gpus) == expected


def test_a_tp_worker_takes_as_many_gpus_as_it_has_ranks():
    cfg = local(**{"model.device": "cuda", "prefill.tp_size": "2", "decode.tp_size": "4"})
    plan = plan_local_cluster(cfg, 2, 1, "/c.yaml", master_argv=MASTER, cpu_count=8, gpu_count=8)
    workers = plan.by_role("prefill") + plan.by_role("decode")
    # prefill-0 on GPUs 0-1, prefill-1 on 2-3, decode-0 on 4-7 (each worker's ranks: its device + r)
    assert [device_of(c) for c in workers] == ["cuda:0", "cuda:2", "cuda:4"]


def test_three_routers_get_consecutive_ports_and_the_same_workers():
    plan = plan_local_cluster(local(**{"router.metrics_port": "9390"}), 2, 1, "/c.yaml", python="py",
                              master_argv=MASTER, cpu_count=4, num_routers=3)
    routers = plan.by_role("router")
    assert [c.name for c in routers] == ["router-0", "router-1", "router-2"]
    base = local().router.port
    assert [dict(c.ports) for c in routers] == [
        {"router.port": base + i, "router.metrics_port": 9390 + i} for i in range(3)]
    assert plan.router_urls == tuple(f"http://127.0.0.1:{base + i}" for i in range(3))
    assert plan.router_url == plan.router_urls[0]
    discovery = [[s for s in sets(c.argv) if s.startswith("discovery.prefill=")] for c in routers]
    assert discovery[0] == discovery[1] == discovery[2] != []


def test_zero_routers_is_refused_by_flag_name():
    with pytest.raises(PlanError, match="--routers must be >= 1"):
        plan_local_cluster(local(), 1, 1, "/c.yaml", python="py", master_argv=MASTER, num_routers=0)


HA = {"store.master_address": "etcd://127.0.0.1:2379", "store.metadata_server": "etcd://127.0.0.1:2379"}


def test_two_ha_masters_take_consecutive_rpc_and_metrics_ports_and_wait_on_metrics_first():
    cfg = local(**HA)
    plan = plan_local_cluster(cfg, 1, 1, "/c.yaml", master_argvs=(MASTER, MASTER + ("--x",)), cpu_count=2)
    masters = plan.by_role("master")
    assert [m.name for m in masters] == ["master-0", "master-1"]
    s = cfg.store
    assert [dict(m.ports) for m in masters] == [
        {"store.master_metrics_port": s.master_metrics_port + i, "store.master_rpc_port": s.master_rpc_port + i}
        for i in range(2)]
    assert masters[0].ports[0][0] == "store.master_metrics_port"  # a standby opens no RPC port
    assert masters[1].argv == MASTER + ("--x",)
    assert master_ports(cfg, 1) == (s.local_hostname, s.master_rpc_port + 1, 0, s.master_metrics_port + 1)


def test_a_second_master_without_ha_is_refused_naming_the_key():
    with pytest.raises(PlanError, match="store.master_address to etcd://"):
        master_ports(local(), 1)
