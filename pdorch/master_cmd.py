"""`pdorch master`: run `mooncake_master` with the flags pdorch expects, from the same config.

One place builds the master's command line from `store.*` keys, for `pdorch serve` (a child on
loopback), bare-metal installs (`pdorch master --config FILE` on the master host) and the Helm
chart's master Deployment (which runs `pdorch master` with the chart's ConfigMap):

    rpc port       <- store.master_address          metadata port <- store.metadata_server
    HA mode        <- store.master_address etcd://...: leader election and metadata replication
                      (oplog) in that etcd; rpc port <- store.master_rpc_port, the address the
                      leader advertises <- store.local_hostname (the pod's IP), cluster id <-
                      store.master_cluster_id; no metadata server (store.metadata_server etcd://)
    metrics port   <- store.master_metrics_port     eviction      <- store.master_eviction_*
    lease / TTL    <- store.master_kv_lease_ttl_ms, store.master_client_ttl_s
    SSD offload    <- store.master_enable_offload (on too when store.ssd_path is set)

Any other mooncake_master flag (SSD offload tuning, `--offloading_queue_limit=100`...) is passed on
as given: the flags `pdorch master` does not know itself, and everything after `--`. A flag that
pdorch sets from the config is refused with the key to set instead (gflags would silently take
the last value), and so is an argument that is not a flag.
"""

from __future__ import annotations

import argparse
import os
import sys

from pdorch.config import Config
from pdorch.launch_plan import PlanError, master_ports


def master_process(cfg: Config, log_dir: str | None = None, bind_host: str | None = None, index: int = 0):
    """A (not yet started) MasterProcess for `cfg.store` (master `index` of several in HA mode on one
    host: launch_plan.master_ports); raises PlanError / MasterError."""
    from store_client.addresses import parse_master_address
    from store_client.master import MasterProcess  # NOTE: lazy: finds the binary at construction

    s = cfg.store
    host, rpc, metadata, metrics = master_ports(cfg, index)
    master = parse_master_address(s.master_address)
    return MasterProcess(rpc, metadata, metrics, host=host, log_dir=log_dir, bind_host=bind_host,
                         ha_etcd=master.etcd_endpoints, cluster_id=s.master_cluster_id,
                         kv_lease_ttl_ms=s.master_kv_lease_ttl_ms, client_ttl_s=s.master_client_ttl_s,
                         eviction_high_watermark_ratio=s.master_eviction_high_watermark,
                         eviction_ratio=s.master_eviction_ratio,
                         enable_offload=s.master_enable_offload or s.ssd_enabled,  # ssd_path: offload on
                         offload_on_evict=s.ssd_enabled and s.ssd_offload_on_evict)


# mooncake_master flags built from the config -> the key that sets them.
OWN_FLAGS = {
    "enable_http_metadata_server": "store.metadata_server", "http_metadata_server_host": "--listen",
    "http_metadata_server_port": "store.metadata_server", "rpc_port": "store.master_address",
    "enable_ha": "store.master_address", "etcd_endpoints": "store.master_address", "rpc_address": "store.local_hostname",
    "cluster_id": "store.master_cluster_id", "enable_oplog": "store.master_address",
    "metrics_host": "--listen", "metrics_port": "store.master_metrics_port",
    "default_kv_lease_ttl": "store.master_kv_lease_ttl_ms", "client_ttl": "store.master_client_ttl_s",
    "eviction_high_watermark_ratio": "store.master_eviction_high_watermark",
    "eviction_ratio": "store.master_eviction_ratio", "enable_offload": "store.master_enable_offload",
    "offload_on_evict": "store.ssd_offload_on_evict",
}


def split_passthrough(argv: list[str]) -> tuple[list[str], list[str]]:
    """`pdorch master ... -- FLAGS`: (pdorch's own arguments, what follows `--`)."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def check_extra_flags(extra: list[str]) -> list[str]:
    """The flags passed on to mooncake_master, as given; ValueError names the first bad one."""
    takes_value = False  # `--name value`: the argument after a flag without `=` may be its value
    for arg in extra:
        name = arg.lstrip("-").split("=", 1)[0]
        if not arg.startswith("-") or not name:
            if takes_value:
                takes_value = False
                continue
            raise ValueError(f"{arg!r} is not a mooncake_master flag (give flags as --name=value)")
        if name in OWN_FLAGS:
            raise ValueError(f"--{name} is set from the config: set {OWN_FLAGS[name]} instead")
        takes_value = "=" not in arg
    return list(extra)


def add_master_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", default="0.0.0.0", metavar="HOST",
                        help="address the metadata and metrics servers listen on (default 0.0.0.0; "
                        "the RPC port always listens on every interface)")
    parser.add_argument("--print", action="store_true", dest="print_only",
                        help="print the mooncake_master command line instead of running it")


def etcd_unreachable(cfg: Config, timeout_s: float = 2.0) -> str | None:
    """HA mode: what is wrong when no etcd endpoint of store.master_address answers (else None): a
    master that cannot reach etcd would wait as a candidate forever."""
    from store_client.addresses import parse_master_address
    from store_client.connector import reachable

    master = parse_master_address(cfg.store.master_address)
    if not master.ha:
        return None
    err = reachable(master.endpoints, timeout_s)
    return None if err is None else (f"store.master_address: no etcd endpoint of {cfg.store.master_address} "
                                     f"answers ({err})")


def run_master(cfg: Config, listen: str, print_only: bool, extra: list[str] = ()) -> int:
    """Replace this process with mooncake_master (signals reach it directly, as PID 1 in a pod);
    `extra`: more mooncake_master flags, appended as given (check_extra_flags)."""
    from store_client.master import MasterError
    if not cfg.store.enabled:
        print("pdorch master: store.enabled is false; nothing to run", file=sys.stderr)
        return 2
    try:
        argv = master_process(cfg, bind_host=listen).command() + check_extra_flags(list(extra))
    except (PlanError, MasterError, ValueError) as e:
        print(f"pdorch master: {e}", file=sys.stderr)
        return 2
    print(" ".join(argv), flush=True)
    if print_only:
        return 0
    err = etcd_unreachable(cfg)
    if err:
        print(f"pdorch master: {err}", file=sys.stderr)
        return 2
    os.execv(argv[0], argv)
    return 1  # not reached
