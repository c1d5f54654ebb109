"""The store-memory node on a real mooncake_master: a pure client's put (store.global_segment_size_mb 0,
as every worker of `pdorch serve --autoscale`) lands in the node's segment, the only one mounted, and a
get from another pure client finds it after the writer's process exited.

Clients are child processes (raw Mooncake store calls), stopped by their own exit.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

import httpx

from pdorch.child_process import Child, stop_children
from pdorch.config_loader import load_config
from pdorch.local_stack.processes import free_port
from pdorch.ports import port_answers
from pdorch.store_memory import MEMORY_NODE_BINARY, memory_node_argv
from store_client.master import MasterProcess, find_mooncake_binary

CLIENT = """
import sys
from mooncake.store import MooncakeDistributedStore
master, metadata, op = sys.argv[1:4]
store = MooncakeDistributedStore()
assert store.setup("127.0.0.1", metadata, 0, 16 << 20, "tcp", "", master) == 0  # a pure client
value = bytes(range(256)) * 64
if op == "put":
    assert store.put("page-0", value) == 0
else:
    assert store.get("page-0") == value, "the page is gone"
store.close()
"""


def client(master: MasterProcess, op: str) -> None:
    out = subprocess.run([sys.executable, "-c", CLIENT, master.master_address, master.metadata_url, op],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr[-2000:]


def test_a_pure_clients_put_lands_in_the_node_and_outlives_the_writer(tmp_path):
    with MasterProcess(log_dir=str(tmp_path)) as master:
        cfg = load_config(None, {"store.master_address": master.master_address,
                                 "store.metadata_server": master.metadata_url, "store.memory_node_segment_mb": 64},
                          environ={})
        port = free_port()
        node = Child("store-memory", memory_node_argv(cfg, find_mooncake_binary(MEMORY_NODE_BINARY), port),
                     tmp_path / "store-memory.log")
        node.start()
        try:
            deadline = time.monotonic() + 30
            while not port_answers("127.0.0.1", port):  # it listens once its segment is mounted
                assert node.running() and time.monotonic() < deadline, node.log_tail(20)
                time.sleep(0.1)
            client(master, "put")  # the writer's process exits here
            text = httpx.get(master.metrics_url, timeout=10).text
            segments = re.findall(r'^segment_allocated_bytes{segment="([^"]+)"} (\S+)$', text, re.MULTILINE)
            assert len(segments) == 1 and float(segments[0][1]) >= 256 * 64, segments  # the node's, holding it
            client(master, "get")
        finally:
            stop_children([node], 10)
