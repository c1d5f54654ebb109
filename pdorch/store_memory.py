"""The store-memory node: a `mooncake_client` process that only contributes memory to the store.

Mooncake may place a page in the segment of the client that writes it, and a segment leaves the
store with its process. In a fleet that scales down (`pdorch serve --autoscale`) a removed worker
would take the pages in its segment with it, even those its drain just wrote back. So there the
store's memory lives in this node, which stays while workers come and go, and the workers are pure
clients (store.global_segment_size_mb 0): their puts land in the node's segment.

    mooncake_client --global_segment_size=<store.memory_node_segment_mb>MB
                    --master_server_address=<store.master_address>  --metadata_server=<store.metadata_server>
                    --protocol --device_names --host=<store.local_hostname> --port=<free port>

It answers on --port once its segment is mounted (the launcher's readiness check). `pdorch store-memory`
runs the same command in the foreground (the Helm chart's storeMemory pods).
"""

from __future__ import annotations

import os
import sys

from pdorch.config import Config
from pdorch.launch_plan import ChildSpec

MEMORY_NODE_BINARY = "mooncake_client"
NAME = "store-memory"
DEFAULT_PORT = 50181  # its RPC port: nothing but a readiness probe talks to it


def memory_node_wanted(cfg: Config, autoscale: bool) -> bool:
    return autoscale and cfg.store.enabled and cfg.store.memory_node_segment_mb > 0


def memory_node_argv(cfg: Config, binary: str, port: int) -> tuple[str, ...]:
    from store_client.addresses import metadata_for_mooncake, parse_master_address

    s = cfg.store
    argv = (binary, f"--global_segment_size={s.memory_node_segment_mb}MB",
            f"--master_server_address={parse_master_address(s.master_address).mooncake}",
            f"--metadata_server={metadata_for_mooncake(s.metadata_server)}", f"--protocol={s.protocol}",
            f"--host={s.local_hostname}", f"--port={port}")
    return argv + ((f"--device_names={s.device_name}",) if s.device_name else ())


def memory_node_spec(cfg: Config, binary: str, port: int) -> ChildSpec:
    """The node as a `pdorch serve` child; its RPC port answers once its segment is mounted."""
    return ChildSpec(NAME, NAME, memory_node_argv(cfg, binary, port), cfg.store.local_hostname,
                     (("mooncake_client --port", port),))


def run_store_memory(cfg: Config, port: int, print_only: bool) -> int:
    """Replace this process with the node (signals reach it directly, as PID 1 in a pod)."""
    from store_client.master import MasterError, find_mooncake_binary
    if not cfg.store.enabled or cfg.store.memory_node_segment_mb <= 0:
        print("pdorch store-memory: needs store.enabled and store.memory_node_segment_mb > 0", file=sys.stderr)
        return 2
    try:
        argv = list(memory_node_argv(cfg, find_mooncake_binary(MEMORY_NODE_BINARY), port))
    except (MasterError, ValueError) as e:
        print(f"pdorch store-memory: {e}", file=sys.stderr)
        return 2
    print(" ".join(argv), flush=True)
    if print_only:
        return 0
    os.execv(argv[0], argv)
    return 1  # not reached
