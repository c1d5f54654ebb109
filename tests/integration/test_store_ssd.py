"""The SSD tier with a real mooncake_master: a page pushed out of DRAM is read back from disk.

The segment holds 16 MiB; 96 pages of 256 KiB are written, so the master evicts about 40 from DRAM
while writing (short leases, as in test_store_eviction). With store.ssd_path set every page was
offloaded to this worker's own directory first, so one load of all 96 returns the bytes written,
and the master counts the reads served from files (`file_cache_hit_nums_`).
"""

from __future__ import annotations

import os
import re
import time

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from pdorch.local_stack.store import model_page_objects, page_pattern, store_config
from store_client.master import MasterProcess
from store_client.metrics import StoreMetrics
from store_client.results import OK
from store_client.ssd_metrics import register_ssd_metrics
from store_client.store import KVStore

PAGES, PAGE_NBYTES, SEGMENT_MB = 96, 256 << 10, 16


def page_files(directory) -> list[str]:
    """The store objects' files offloaded under `directory`, but the store clients' own canaries (one small
    pinned object per client, store_client/connector.py)."""
    return [f for _, _, fs in os.walk(directory) for f in fs if "pdorch-canary" not in f]


def all_files(directory) -> int:
    return sum(len(fs) for _, _, fs in os.walk(directory))


def master_value(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0


@pytest.fixture
def offload_master(tmp_path):
    master = MasterProcess(log_dir=str(tmp_path), kv_lease_ttl_ms=200, enable_offload=True).start()
    yield master
    master.stop()


def fill(store: KVStore, keys, pages) -> None:
    """Write every page, 8 at a time; a full segment refuses (no_space) until the master evicts."""
    for i in range(0, len(keys), 8):
        idx = range(i, min(i + 8, len(keys)))
        deadline = time.monotonic() + 10
        while True:
            r = store.save([keys[j] for j in idx], [pages.ctypes.data + j * PAGE_NBYTES for j in idx])
            if r.reason == OK or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert r.reason == OK, (i, r)


def test_page_evicted_from_dram_is_read_back_from_ssd(offload_master, tmp_path):
    cfg = store_config(offload_master, global_segment_size_mb=SEGMENT_MB, ssd_path=str(tmp_path / "ssd"))
    pages = page_pattern(25, PAGES, PAGE_NBYTES)
    back = np.zeros_like(pages)
    keys = [f"ssd-test/{i}" for i in range(PAGES)]
    registry = CollectorRegistry()
    store = KVStore(cfg, PAGE_NBYTES, StoreMetrics(registry), component="prefill-0")
    assert register_ssd_metrics(store, registry) is not None
    try:
        assert store.wait_enabled(30)
        assert store.ssd_dir == str(tmp_path / "ssd" / "prefill-0")
        store.register_buffer(pages.ctypes.data, pages.nbytes)
        store.register_buffer(back.ctypes.data, back.nbytes)
        fill(store, keys, pages)
        time.sleep(3)  # the offload of the last writes (the client's heartbeat) and their leases
        before = offload_master.metrics_text()
        evicted = master_value(before, "master_evicted_key_count")
        assert evicted >= PAGES - SEGMENT_MB * (1 << 20) // PAGE_NBYTES, before  # DRAM really overflowed
        files = page_files(store.ssd_dir)
        assert len(files) == PAGES, files[:5]
        r = store.load(keys, [back.ctypes.data + j * PAGE_NBYTES for j in range(PAGES)])
        assert r.reason == OK and r.pages_loaded == PAGES, r
        assert np.array_equal(back, pages)  # every byte, those evicted from DRAM included
        # the metric counts every object's file, the client's canary too
        assert registry.get_sample_value("pdorch_store_ssd_files") == all_files(store.ssd_dir) >= PAGES
        assert registry.get_sample_value("pdorch_store_ssd_bytes") >= PAGES * PAGE_NBYTES
        assert registry.get_sample_value("pdorch_store_ssd_rpc_reads_total") >= 1  # the evicted pages' read
        after = offload_master.metrics_text()
        from_files = master_value(after, "file_cache_hit_nums_") - master_value(before, "file_cache_hit_nums_")
        assert from_files >= evicted, after
        # our per-page attribution (the replica lookup): exactly the pages the master evicted from DRAM
        ssd = sum(r.page_ssd)
        assert evicted <= ssd <= master_value(after, "master_evicted_key_count"), (ssd, evicted, after)
        # NOTE: the master counts the lookup as a file hit too: twice the pages read from files
        assert from_files == 2 * ssd, (from_files, ssd)
        assert registry.get_sample_value("pdorch_store_tier_pages_read_total", {"tier": "ssd"}) == ssd
        assert registry.get_sample_value("pdorch_store_tier_pages_read_total", {"tier": "dram"}) == PAGES - ssd
    finally:
        store.close()


def test_dram_only_loses_the_evicted_pages(offload_master, tmp_path):
    """The control: the same writes without ssd_path; the evicted pages are gone."""
    cfg = store_config(offload_master, global_segment_size_mb=SEGMENT_MB)
    pages = page_pattern(26, PAGES, PAGE_NBYTES)
    back = np.zeros_like(pages)
    keys = [f"dram-test/{i}" for i in range(PAGES)]
    store = KVStore(cfg, PAGE_NBYTES, StoreMetrics(CollectorRegistry()))
    try:
        assert store.wait_enabled(30)
        assert store.ssd_dir == ""
        assert register_ssd_metrics(store, CollectorRegistry()) is None
        store.register_buffer(pages.ctypes.data, pages.nbytes)
        store.register_buffer(back.ctypes.data, back.nbytes)
        fill(store, keys, pages)
        time.sleep(1)
        r = store.load(keys, [back.ctypes.data + j * PAGE_NBYTES for j in range(PAGES)])
        assert r.pages_loaded <= SEGMENT_MB * (1 << 20) // PAGE_NBYTES, r
        assert r.page_ssd == ()  # no SSD tier: no replica lookup, nothing attributed to disk
    finally:
        store.close()


def test_workers_write_to_their_own_ssd_directories(tmp_path, tiny_model_dir):
    """P and D with store.ssd_path: each worker gets `<ssd_path>/<worker id>`, every page written
    lands there as a file, and the workers' /metrics say so."""
    from pdorch.local_stack.workers import start_cluster, worker_metric

    ssd = tmp_path / "ssd"
    cluster = start_cluster(tmp_path, tiny_model_dir, with_store=True, store={"ssd_path": str(ssd)})
    try:
        prefill = next(w for w in cluster.workers if w.role == "prefill")
        decode = next(w for w in cluster.workers if w.role == "decode")
        cluster.generate([(i * 31) % 1000 + 10 for i in range(16 * 8)], max_tokens=4)
        p_dir, d_dir = ssd / f"prefill-127.0.0.1-{prefill.port}", ssd / f"decode-127.0.0.1-{decode.port}"
        # P's computed prompt pages at least; the store writes complete after the answer (seen: 0 at once in CI)
        deadline = time.monotonic() + 30
        while (written := sum(worker_metric(w, "pdorch_store_pages_written_total") for w in (prefill, decode))) < 8:
            assert time.monotonic() < deadline, f"{written} pages written 30 s after the answer"
            time.sleep(0.1)

        def files(d) -> int:
            return len(page_files(d))

        # NOTE: a page's file lands in the directory of the worker whose DRAM segment the master put
        # it in (that client offloads it), not always the writer's: count both.
        # a file per store object: one per group of KV heads of each page (store_client/page_objects.py)
        objects = written * model_page_objects(tiny_model_dir).groups
        deadline = time.monotonic() + 30  # the offload heartbeat (1 s) copies them
        while time.monotonic() < deadline and files(p_dir) + files(d_dir) < objects:
            time.sleep(0.2)
        assert sorted(os.listdir(ssd)) == sorted([p_dir.name, d_dir.name])
        assert files(p_dir) + files(d_dir) == objects, (files(p_dir), files(d_dir), written, objects)
        time.sleep(10.5)  # the metrics' directory walk runs at most every 10 s
        # the metric counts every object's file, the clients' canaries too
        assert sum(worker_metric(w, "pdorch_store_ssd_files") for w in (prefill, decode)) == \
            all_files(p_dir) + all_files(d_dir) >= objects
    finally:
        cluster.stop()


def test_a_prefix_pushed_out_of_dram_comes_back_from_ssd_with_the_same_output(tmp_path, tiny_model_dir):
    """Through the workers: a conversation's pages leave DRAM (a pure client's filler makes the master
    evict them), its next turn reads them from the workers' SSD files, the answer's cached tokens say
    `ssd`, and the output equals the first run's."""
    from pdorch.local_stack.workers import start_cluster

    cluster = start_cluster(tmp_path, tiny_model_dir, with_store=True, kv_lease_ttl_ms=200,
                            store={"ssd_path": str(tmp_path / "ssd"), "global_segment_size_mb": 16,
                                   "eviction": "master"})
    filler = KVStore(store_config(cluster.master, global_segment_size_mb=0), PAGE_NBYTES,
                     StoreMetrics(CollectorRegistry()))
    try:
        prompt = [(i * 37) % 1000 + 10 for i in range(16 * 12)]
        first = cluster.generate(prompt, max_tokens=8)
        cluster.flush_l1()  # what follows finds the prefix in the store only
        time.sleep(3)  # the workers' offload heartbeat (1 s) copies their pages to disk
        before = cluster.master.metrics_text()
        assert filler.wait_enabled(30)
        pages = page_pattern(27, 8, PAGE_NBYTES)
        filler.register_buffer(pages.ctypes.data, pages.nbytes)
        for batch in range(3 * 2 * 16 * (1 << 20) // PAGE_NBYTES // 8):  # 3 x the DRAM of both workers
            fill(filler, [f"filler/{batch}/{j}" for j in range(8)], pages)
        assert master_value(cluster.master.metrics_text(), "master_evicted_key_count") > \
            master_value(before, "master_evicted_key_count")
        second = cluster.generate(prompt, max_tokens=8)
        print("first", first.cached, "second", second.cached)
        assert second.token_ids == first.token_ids
        assert second.cached.ssd > 0, second.cached
        assert second.cached.device + second.cached.store + second.cached.ssd <= len(prompt)
    finally:
        filler.close()
        cluster.stop()
