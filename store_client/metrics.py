"""Prometheus metrics of the store tier (L3).

Created once per registry and handed to KVStore explicitly: a worker passes its own /metrics
registry, tests and benchmarks a private one. Prometheus refuses duplicate metric names in one
registry, so objects share one StoreMetrics instead of creating their own.

Reasons (label `reason`) tell an operator why a page was not read:
  absent          the store does not have the key (never written, evicted)
  transfer_failed the key exists but reading its bytes failed (segment owner dead, bad size)
  rpc_failed      the master did not answer (master lost; the store disables itself until it returns)
  timeout         the operation missed its deadline (queued too long, or failed after the deadline)
  disabled        the store was not connected, so nothing was tried
"""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

OPS = ("match", "load", "save")
EVICT_SKIP_REASONS = ("leased", "absent", "failed")
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class StoreMetrics:
    """All of the store tier's series, in three groups: reads and writes, the connection (and HA
    masters), chain eviction."""

    def __init__(self, registry: CollectorRegistry | None = None):
        reg = registry if registry is not None else REGISTRY
        self._io(reg, "pdorch_store_")
        self._connection(reg, "pdorch_store_")
        self._eviction(reg, "pdorch_store_")

    def _io(self, reg: CollectorRegistry, p: str) -> None:
        self.pages_read = Counter(p + "pages_read", "Pages loaded from the store into the pool", registry=reg)
        self.bytes_read = Counter(p + "bytes_read", "Bytes loaded from the store into the pool", registry=reg)
        self.tier_pages_read = Counter(p + "tier_pages_read", "Pages loaded from the store, by the store tier "
                                       "they came from (dram; ssd: Mooncake's offload files)", ["tier"],
                                       registry=reg)
        self.pages_written = Counter(p + "pages_written", "Pages written to the store", registry=reg)
        self.bytes_written = Counter(p + "bytes_written", "Bytes written to the store", registry=reg)
        self.no_space_retries = Counter(p + "no_space_retried_pages", "SSD tier: page writes DRAM refused "
                                        "(no space) and tried again, once per try", registry=reg)
        self.pages_skipped = Counter(p + "pages_skipped_existing",
                                     "Pages not written because the store already had the key", registry=reg)
        self.op_seconds = Histogram(p + "op_seconds", "Latency of one batched store operation", ["op"],
                                    buckets=_LATENCY_BUCKETS, registry=reg)
        self.hits = Counter(p + "hit_pages", "Pages found (match) or read (load)", ["op"], registry=reg)
        self.misses = Counter(p + "miss_pages", "Pages not found/read, by reason", ["op", "reason"],
                              registry=reg)
        self.hole_pages = Counter(p + "hole_pages", "Pages read from the store after a missing page of the "
                                  "same request (each would have been recomputed by a prefix-only reader)",
                                  registry=reg)
        self.save_failures = Counter(p + "save_failed_pages", "Pages whose write failed, by reason",
                                     ["reason"], registry=reg)
        self.saves_dropped = Counter(p + "save_dropped_pages",
                                     "Pages of saves dropped before running (queue full, cancelled, closed)",
                                     ["reason"], registry=reg)
        self.queue_depth = Gauge(p + "queue_depth", "Store I/O operations queued or running", ["op"],
                                 registry=reg)
        for op in OPS:  # export zeros from the start, so dashboards show "no traffic" rather than "no data"
            self.op_seconds.labels(op)
        for op in ("match", "load"):
            self.hits.labels(op)
        for op in ("load", "save"):
            self.queue_depth.labels(op)
        for tier in ("dram", "ssd"):
            self.tier_pages_read.labels(tier)

    def _connection(self, reg: CollectorRegistry, p: str) -> None:
        self.enabled = Gauge(p + "enabled", "1 while the store is connected and healthy, else 0", registry=reg)
        self.reconnects = Counter(p + "reconnects", "Times the store came back after being lost", registry=reg)
        # HA masters only (store.master_address etcd://...): read from etcd's master view each second
        self.master_leading = Gauge(p + "master_leading", "HA masters: 1 while etcd names a leading "
                                    "mooncake_master, else 0 (not exported for a single master)", registry=reg)
        self.master_leader_changes = Counter(p + "master_leader_changes", "HA masters: times another "
                                             "mooncake_master took the lead", registry=reg)
        self.lost_on_leader_change = Counter(p + "lost_on_leader_change_pages", "HA masters: pages this worker "
                                             "wrote shortly before a leader switch that the new leader did not "
                                             "know (the worker writes again those its L1 holds)", registry=reg)
        self.connect_failures = Counter(p + "connect_failures",
                                        "Failed attempts to reach the master while the store is down",
                                        registry=reg)

    def _eviction(self, reg: CollectorRegistry, p: str) -> None:
        """Chain eviction (store_client/evictor.py): what pdorch removed from the store, and why not."""
        self.evicted_pages = Counter(p + "evicted_pages", "Pages pdorch's chain eviction removed from the store",
                                     registry=reg)
        self.evict_skipped = Counter(p + "evict_skipped_pages", "Eviction victims not removed, by reason "
                                     "(leased: being read, kept; absent: already gone; failed)", ["reason"],
                                     registry=reg)
        self.evicted_stale_pages = Counter(p + "evicted_stale_pages", "Of the evicted pages, those of "
                                           "conversations that stopped coming back (stale; chain_index.py)",
                                           registry=reg)
        self.stale_after_seconds = Gauge(p + "stale_after_seconds", "A store page unused this long is stale and "
                                         "leaves first (2 x the p90 time a conversation takes to come back; 0: "
                                         "not learnt yet)", registry=reg)
        self.fill_ratio = Gauge(p + "fill_ratio", "The master's allocated / capacity bytes, as last read",
                                registry=reg)
        self.chain_index_pages = Gauge(p + "chain_index_pages", "Store pages the chain index knows", registry=reg)
        self.chain_index_forgotten = Counter(p + "chain_index_forgotten_pages", "Pages dropped from a full "
                                             "chain index (left to the master's eviction)", registry=reg)
        self.master_metrics_failures = Counter(p + "master_metrics_failures",
                                               "Failed reads of the master's /metrics by the evictor", registry=reg)
        for reason in EVICT_SKIP_REASONS:
            self.evict_skipped.labels(reason)
