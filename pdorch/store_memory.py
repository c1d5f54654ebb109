"""The store-memory node: a `mooncake_client` process that only contributes memory to the store.

Mooncake may place a page in the segment of the client that writes it, and a segment leaves the
store with its process. In a fleet that scales down (`pdorch serve --autoscale`) a removed worker
would take the pages in its segment with it, even those its drain just wrote back. So there the
store's memory lives in this node, which stays while workers come and go, and the workers are pure
clients (store.global_segment_size_mb 0): their puts land in the node's segment.

    mooncake_client --global_segment_size=<store.memory_node_segment_mb>MB
                    --master_server_address=<store.master_address>  --metadata_server=<store.metadata_server>
                    --protocol --device_names --host=<store.local_hostname> --port=<free port>

It answers on --port once its segment is mounted (the launcher's readiness check).
"""

from __future__ import annotations

from pdorch.config import Config
from pdorch.launch_plan import ChildSpec

MEMORY_NODE_BINARY = "mooncake_client"
NAME = "store-memory"


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
