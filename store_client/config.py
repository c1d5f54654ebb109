"""The store section of the configuration (`store:` in YAML): store_client's own frozen config.

Declared here, not in pdorch/config.py, so store_client depends on nothing in pdorch; pdorch's
Config embeds it as its `store` section, and the loader, docs and JSON Schema read its field
metadata like every other section's (see pdorch/config.py for the metadata keys).
"""

from __future__ import annotations

from dataclasses import dataclass, field


def _key(default, help: str, **rules):
    """A config key with its documentation and validation rules (pdorch/config.py's convention)."""
    return field(default=default, metadata={"help": help, **rules})


@dataclass(frozen=True)
class StoreConfig:
    """The Mooncake store (L3 KV tier) and the transfer engine between workers."""

    enabled: bool = _key(True, "Use the Mooncake store as the L3 KV tier")
    master_address: str = _key("127.0.0.1:50151", "mooncake_master's RPC address host:port, or etcd://h1:p1;"
                                 "etcd://h2:p2 for masters in HA mode (the client finds the leader in etcd)",
                                 format="master_address", required_when=("enabled", True))
    metadata_server: str = _key("http://127.0.0.1:8180/metadata", "The transfer engine's metadata: an HTTP "
                                "metadata server's URL, or etcd://h1:p1;etcd://h2:p2 (etcd)",
                                format="metadata_server", required_when=("enabled", True))
    protocol: str = _key("tcp", "Transport to the store and between workers", choices=["tcp", "rdma"])
    device_name: str = _key("", "RDMA device(s), e.g. mlx5_0; empty for tcp")
    local_hostname: str = _key("127.0.0.1", "Address this worker advertises to the store, the transfer engine "
                               "and etcd (a pod's IP in Kubernetes); also the gRPC address registered in etcd "
                               "when the worker listens on a wildcard host")
    global_segment_size_mb: int = _key(512, "Memory this worker contributes to the store pool (MiB); "
                                       "0 = pure client", min=0)
    memory_node_segment_mb: int = _key(1024, "The store-memory node's segment (MiB): a mooncake_client holding the "
                                       "store's pages while workers come and go (`pdorch serve --autoscale` starts "
                                       "one, the chart's storeMemory runs them: `pdorch store-memory`); the workers "
                                       "are then pure clients (global_segment_size_mb 0). 0 = serve --autoscale "
                                       "starts none: each worker contributes global_segment_size_mb, and a removed "
                                       "worker's pages leave with it", min=0)
    local_buffer_size_mb: int = _key(64, "Staging buffer for copying store calls (MiB)", min=1)
    io_threads: int = _key(2, "Threads running batched store I/O; with 2+ one serves loads only and one "
                           "batch moves bytes while another waits for the GIL", min=1, max=16)
    op_timeout_s: float = _key(10.0, "Deadline for one batched store operation", min=0.1)
    reconnect_interval_s: float = _key(5.0, "Seconds between reconnect attempts while the master is down",
                                       min=0.1)
    write_back: bool = _key(True, "Prefill writes the full pages it computes to the store (which and when: "
                            "write_policy); false = never")
    write_policy: str = _key("write_through", "Which prefill pages are written to the store, and when "
                             "(docs/workers.md, \"Write policies\"): `write_through` = every computed full page "
                             "at once; `write_through_selective` = a page once it has been used "
                             "write_selective_uses times (computed, then hit in the prefill L1); `write_back` = "
                             "a page only when the prefill L1 gives it up. The decode worker writes through "
                             "under every policy", choices=["write_through", "write_through_selective", "write_back"])
    write_selective_uses: int = _key(2, "write_through_selective: the use of a page (1 = computing it, each L1 "
                                     "hit one more) at which it is written", min=1)
    save_chunk_pages: int = _key(16, "Pages per store write call; a queued load waits at most one chunk",
                                 min=1, max=4096)
    max_pending_save_pages: int = _key(256, "Pages of queued store writes (each pins its pages): while the "
                                       "queue holds this many, new saves are dropped, never blocking requests "
                                       "(one save may take it past; 0 = no store writes)", min=0)
    master_rpc_port: int = _key(50151, "Masters in HA mode: the RPC port each master listens on (the clients "
                                "find the leader's address in etcd)", min=1, max=65535)
    master_cluster_id: str = _key("mooncake_cluster", "Masters in HA mode: their --cluster_id, which names "
                                  "their leader's key in etcd (mooncake-store/<id>/master_view)")
    audit_window_s: float = _key(20.0, "Masters in HA mode: after a leader switch each worker asks the new leader "
                                 "for the pages it wrote in the last this many seconds and writes again, from its "
                                 "L1, those the new leader lacks (writes the oplog had not replicated, or all of "
                                 "them when a master restarted empty)", min=1.0)
    audit_max_pages: int = _key(131072, "Masters in HA mode: the most pages the audit after a leader switch "
                                "remembers (~250 bytes each: 32 MiB at the default); a worker writing more within audit_window_s audits "
                                "the newest this many", min=1)
    master_metrics_port: int = _key(9103, "mooncake_master metrics port (local launcher; workers read the "
                                    "store's fill level there for eviction)", min=1, max=65535)
    master_eviction_high_watermark: float = _key(0.9, "mooncake_master's own generic eviction starts above "
                                                 "this fill ratio (the backstop behind `eviction: chain`)",
                                                 min=0.1, max=1.0)
    master_eviction_ratio: float = _key(0.05, "mooncake_master: fraction of objects its generic eviction "
                                        "removes at once", min=0.0, max=1.0)
    master_kv_lease_ttl_ms: int = _key(10000, "mooncake_master: an object read or written is not evicted for "
                                       "this long (ms). With the SSD tier set 1000: a DRAM full of leased pages "
                                       "refuses writes (docs/operations.md, Tuning)", min=1)
    master_client_ttl_s: int = _key(10, "mooncake_master: a client silent this long is considered gone and "
                                    "its segment unmounted", min=1)
    master_enable_offload: bool = _key(False, "mooncake_master: let clients offload evicted objects to local "
                                       "SSD (Mooncake's SSD tier; clients need its storage settings)")
    ssd_path: str = _key("", "SSD tier (Mooncake's offload): a directory on local disk; each worker writes under "
                         "its own subdirectory of it, named by its worker id (docs/workers.md, \"The SSD tier\"). Empty = DRAM only. "
                         "Set, it also turns on the master's offload (master_enable_offload)", format="abspath")
    ssd_capacity_gb: float = _key(0.0, "SSD tier: bytes each worker may keep on disk (GiB), reported to the "
                                  "master; 0 = Mooncake's default. NOTE: Mooncake 0.3.13 does not enforce it "
                                  "(measured: docs/workers.md)", min=0.0)
    ssd_offload_interval_s: int = _key(1, "SSD tier: how often the client copies newly written objects to "
                                       "disk (Mooncake's offload heartbeat, its default 10 s). Once DRAM was "
                                       "full, writes were refused until the next copy (measured: "
                                       "docs/workers.md)", min=1, max=3600)
    ssd_offload_on_evict: bool = _key(False, "SSD tier: the master copies a page to disk as it evicts it from DRAM "
                                      "(and keeps it in DRAM until then) instead of after every write "
                                      "(mooncake_master --offload_on_evict). Off: measured, the pinned pages "
                                      "filled DRAM and more writes were refused (docs/workers.md has the "
                                      "measurement)")
    eviction: str = _key("chain", "Who decides what leaves the store: `chain` = pdorch removes the pages "
                         "deepest in their conversation and least recently used first (tails before heads) "
                         "before the master's watermark is reached; `master` = only mooncake_master's "
                         "generic eviction. With `ssd_path` set the master's always governs: it moves "
                         "pages from DRAM to disk, where a chain removal would delete them (docs/workers.md "
                         "has the measurement)", choices=["chain", "master"])
    evict_high_watermark: float = _key(0.89, "chain eviction: start removing pages when the store is this "
                                       "full (keep it below master_eviction_high_watermark)", min=0.05, max=1.0)
    evict_low_watermark: float = _key(0.88, "chain eviction: remove pages until the store is this full",
                                      min=0.0, max=1.0, below="evict_high_watermark")
    evict_interval_s: float = _key(0.2, "chain eviction: how often the store's fill level is read",
                                   min=0.01, max=60.0)
    evict_depth_weight_s: float = _key(60.0, "chain eviction: a page one step deeper in its conversation "
                                       "counts as used this many seconds earlier (0 = plain LRU)", min=0.0)
    evict_index_pages: int = _key(262144, "chain eviction: store pages this worker remembers (key, depth, "
                                  "last use); the oldest are forgotten beyond it", min=1)

    @property
    def ssd_enabled(self) -> bool:
        return bool(self.ssd_path)

    @property
    def eviction_in_effect(self) -> str:
        """`eviction`, except with the SSD tier: a chain removal deletes the page's disk copy too,
        while the master's DRAM eviction keeps it, so the master decides (docs/workers.md)."""
        return "master" if self.ssd_enabled else self.eviction

    def ssd_dir(self, component: str) -> str:
        """This worker's own offload directory. Mooncake names a file after tenant and key only
        (measured), so P and D in one directory would hold the same names; each gets its own."""
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in component)
        return self.ssd_path.rstrip("/") + "/" + safe
