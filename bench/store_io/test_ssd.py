"""The pure parts of bench/store_io/run.py's SSD case: which tier each key is on, the medians and ratios,
and dropping the files' page cache (a real file, a real fadvise, checked with mincore)."""

from __future__ import annotations

import os
import time
from enum import Enum
from types import SimpleNamespace

from bench.store_io.ssd import (
    cpu_seconds,
    drop_page_cache,
    machine_busy_seconds,
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
               "loop_it_s": [1.0, 2.0, 3.0], "ssd_pages_per_load": [], "ssd_idle_cores": [1.0, 1.5, 2.0],
               "ssd_idle_other_cores": [0.1, 0.2, 0.3], "ssd_under_load_io_cores": [0.8, 0.8, 0.8],
               "ssd_under_load_loop_cores": [0.9, 0.9, 0.9], "ssd_under_load_other_cores": [0.2, 0.3, 0.1]}
    res = summarize(samples, 1000)
    assert res["ssd_idle_bytes_s"] == 200.0 and res["sequential_read_bytes_s"] == 450.0
    assert res["ssd_under_load_ratio"] == 160.0 / 200.0
    assert res["ssd_gil_ratio"] == 160.0 / 190.0
    assert res["ssd_idle_vs_sequential_ratio"] == 200.0 / 450.0
    assert res["ssd_idle_cpu_s_per_gb"] == 1.5 / 200.0 * 1e9  # core-seconds per GB at the median rate
    assert res["ssd_under_load_cpu_s_per_gb"] == 0.8 / 160.0 * 1e9
    # CPU bound: the cores left (all, less loop 0.9 and rest 0.2) at 1.5 core-s per 200 B, against idle
    left = os.cpu_count() - 0.9 - 0.2
    assert abs(res["ssd_cpu_bound_ratio"] - min(1.0, left / (1.5 / 200.0) / 200.0)) < 1e-9
    assert res["ssd_samples"] is samples


def test_cpu_bound_ratio_is_below_one_when_the_cores_left_are_short(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    samples = {"ssd_idle": [100.0], "ssd_under_load": [60.0], "ssd_outproc": [70.0], "sequential": [200.0],
               "loop_it_s": [1.0], "ssd_pages_per_load": [], "ssd_idle_cores": [1.5], "ssd_idle_other_cores": [0.1],
               "ssd_under_load_io_cores": [0.9], "ssd_under_load_loop_cores": [0.8], "ssd_under_load_other_cores": [0.2]}
    # 1.0 core left at 1.5 core-s per 100 B/s: 66.7 B/s, 0.67 of idle
    assert abs(summarize(samples, 1000)["ssd_cpu_bound_ratio"] - 1.0 / 1.5) < 1e-9


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


def test_machine_busy_seconds_counts_this_process_spinning():
    before, t0 = machine_busy_seconds(), time.perf_counter()
    while time.perf_counter() - t0 < 0.3:
        pass
    assert machine_busy_seconds() - before >= 0.15  # every process counts, this one included
