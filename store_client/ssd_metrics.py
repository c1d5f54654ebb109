"""The SSD tier's Prometheus metrics of one worker, computed at scrape time.

Ours: what this worker's SSD directory holds (a walk of its files, at most every `rescan_s`, since a
directory of many small files is slow to walk) and the configured capacity. Mooncake's: the client's
count of reads its offload RPC server answered (`get_offload_rpc_read_count`). Cluster-wide SSD
counters (objects on disk, reads served from files, file bytes) are the master's own metrics on its
/metrics (docs/workers.md, "The SSD tier"); they are not repeated per worker.
"""

from __future__ import annotations

import os
import time

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


def directory_usage(path: str) -> tuple[int, int]:
    """(bytes, files) under path; (0, 0) when it does not exist yet."""
    total = files = 0
    for root, _, names in os.walk(path):
        for name in names:
            try:
                total += os.path.getsize(os.path.join(root, name))
                files += 1
            except OSError:  # removed by Mooncake's eviction while we walk
                pass
    return total, files


class SsdCollector:
    def __init__(self, store, capacity_bytes: int, rescan_s: float = 10.0):
        self.store = store  # a KVStore with the SSD tier on (store.ssd_dir)
        self.capacity_bytes = capacity_bytes
        self.rescan_s = rescan_s
        self._usage = (0, 0)
        self._scanned_at = float("-inf")

    def usage(self) -> tuple[int, int]:
        if time.monotonic() - self._scanned_at >= self.rescan_s:
            self._usage, self._scanned_at = directory_usage(self.store.ssd_dir), time.monotonic()
        return self._usage

    def collect(self):
        nbytes, nfiles = self.usage()
        p = "pdorch_store_ssd_"
        yield GaugeMetricFamily(p + "bytes", "Bytes of this worker's SSD tier directory (ours, a walk of its "
                                "files)", value=nbytes)
        yield GaugeMetricFamily(p + "files", "Objects (files) in this worker's SSD tier directory (ours)",
                                value=nfiles)
        yield GaugeMetricFamily(p + "capacity_bytes", "store.ssd_capacity_gb in bytes (0: Mooncake's default; "
                                "not enforced by Mooncake 0.3.13)", value=self.capacity_bytes)
        client = self.store.raw_client()
        reads = client.get_offload_rpc_read_count() if client is not None else 0
        yield CounterMetricFamily(p + "rpc_reads", "Reads of this worker's SSD objects answered by its offload "
                                  "RPC server (Mooncake's count; one batch_get_into may be one read)", value=reads)


def register_ssd_metrics(store, registry) -> SsdCollector | None:
    """Add the SSD tier's metrics to registry when the store has one; None otherwise."""
    if not store.ssd_dir:
        return None
    collector = SsdCollector(store, int(store.cfg.ssd_capacity_gb * (1 << 30)))
    registry.register(collector)
    return collector
