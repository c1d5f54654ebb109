"""The pure parts of bench/store_io.py's SSD case: which tier each key is on, the medians and ratios,
and dropping the files' page cache (a real file, a real fadvise, checked with mincore)."""

from __future__ import annotations

import os
import time
from enum import Enum
from types import SimpleNamespace

from bench.store_io_ssd import (
    cpu_seconds,
    drop_page_cache,
    resident_bytes,
    sequential_read_bytes_s,
    summarize,
    tier_counts,
)


class Status(Enum):  # the names of Mooncake's ReplicaStatus that replica_tier reads
    COMPLETE = 1
    PROCESSING = 2


def replica(kind: str, status: Status = Status.COMPLETE) -> SimpleNamespace:
    return SimpleNamespace(status=status, is_memory_replica=lambda: kind == "mem",
                           is_disk_replica=lambda: kind == "disk", is_local_disk_replica=lambda: False)


def test_tier_counts_disk_only_dram_and_absent():
    descs = {
        "a": [replica("disk")],  # evicted from DRAM after its offload: disk-only
        "b": [replica("mem"), replica("disk")],  # still in DRAM: read from DRAM
        "c": [replica("mem", Status.PROCESSING), replica("disk")],  # an unfinished DRAM copy does not count
        "d": [replica("disk", Status.PROCESSING)],  # nothing complete
    }
    assert tier_counts(descs, ["a", "b", "c", "d", "e"]) == {"disk_only": 2, "in_dram": 1, "absent": 2}


def test_summarize_medians_and_ratios():
    samples = {"ssd_idle": [100.0, 300.0, 200.0], "ssd_under_load": [150.0, 170.0, 160.0],
               "ssd_outproc": [200.0, 180.0, 190.0], "sequential": [400.0, 500.0, 450.0],
               "loop_it_s": [1.0, 2.0, 3.0], "ssd_pages_per_load": [], "ssd_idle_cores": [1.0, 1.5, 2.0]}
    res = summarize(samples, 1000)
    assert res["ssd_idle_bytes_s"] == 200.0 and res["sequential_read_bytes_s"] == 450.0
    assert res["ssd_under_load_ratio"] == 160.0 / 200.0
    assert res["ssd_gil_ratio"] == 160.0 / 190.0
    assert res["ssd_idle_vs_sequential_ratio"] == 200.0 / 450.0
    assert res["ssd_idle_cpu_s_per_gb"] == 1.5 / 200.0 * 1e9  # core-seconds per GB at the median rate
    assert res["ssd_samples"] is samples


def test_drop_page_cache_empties_the_cache_of_a_read_file(tmp_path):
    path = str(tmp_path / "page")
    with open(path, "wb") as f:
        f.write(os.urandom(1 << 20))
    assert sequential_read_bytes_s([path]) > 0  # the read brings the file into the page cache
    assert resident_bytes([path]) > 0
    assert drop_page_cache([path])
    assert resident_bytes([path]) == 0


def test_cpu_seconds_counts_this_process_spinning():
    before, t0 = cpu_seconds(), time.perf_counter()
    while time.perf_counter() - t0 < 0.3:
        pass
    assert cpu_seconds(os.getpid()) - before >= 0.15  # clock ticks are 10 ms; a busy 0.3 s on a shared machine
