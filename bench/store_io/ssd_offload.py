"""Measure Mooncake's SSD offload against a real mooncake_master (docs/workers.md, "The SSD tier").

Writes `--pages` pages into a store whose DRAM segment holds fewer, waits for the offload, then
reads every page back with one batch_get_into and compares bytes; prints the numbers as JSON:
pages read back (from DRAM and from disk), files on disk, the master's offload/SSD counters, and
with --restart what a new client process on the same directory reads back.

    python bench/store_io/ssd_offload.py [--backend bucket_storage_backend] [--restart] [--offload-on-evict]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import tempfile
import time

import numpy as np


def master_counters(text: str) -> dict[str, float]:
    """The master's /metrics lines that mention offload, ssd, file or eviction (name -> value)."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not re.search(r"offload|ssd|file|evict|disk|allocated|capacity", line, re.IGNORECASE):
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            pass
    return out


def setup_client(metadata_url: str, master_address: str, ssd: str, segment_mb: int):
    from mooncake.store import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    rc = store.setup({"local_hostname": "127.0.0.1", "metadata_server": metadata_url,
                      "global_segment_size": segment_mb << 20, "local_buffer_size": 16 << 20,
                      "protocol": "tcp", "master_server_addr": master_address,
                      "enable_ssd_offload": True, "ssd_offload_path": ssd})
    assert rc == 0, f"setup failed {rc}"
    return store


def read_again(metadata_url: str, master_address: str, ssd: str, args) -> dict:
    """A second client process on the first one's directory: does it serve the files left there?"""
    os.environ["MOONCAKE_OFFLOAD_STORAGE_BACKEND_DESCRIPTOR"] = args.backend
    store = setup_client(metadata_url, master_address, ssd, args.segment_mb)
    time.sleep(args.wait_s)  # its heartbeats: whatever it registers from disk
    page = args.page_kb << 10
    data = np.random.default_rng(1).integers(0, 256, size=(args.pages, page), dtype=np.uint8)
    back = np.zeros_like(data)
    store.register_buffer(back.ctypes.data, back.nbytes)
    keys = [f"ssd-bench/{i}" for i in range(args.pages)]
    found = store.batch_is_exist(keys)
    got = store.batch_get_into(keys, [back.ctypes.data + j * page for j in range(args.pages)], [page] * args.pages)
    out = {"exist": sum(c == 1 for c in found), "get_codes": sorted(set(got)),
           "read_equal": sum(bool(g == page and np.array_equal(back[j], data[j])) for j, g in enumerate(got))}
    store.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", type=int, default=96)
    ap.add_argument("--page-kb", type=int, default=256)
    ap.add_argument("--segment-mb", type=int, default=16)
    ap.add_argument("--backend", default="file_per_key_storage_backend")
    ap.add_argument("--wait-s", type=float, default=8.0, help="pause between writes and reads (offload)")
    ap.add_argument("--chunk", type=int, default=8, help="pages per batch_put_from")
    ap.add_argument("--lease-ms", type=int, default=200)
    ap.add_argument("--retries", type=int, default=20, help="retries of a refused (-200) put, 0.2 s apart")
    ap.add_argument("--restart", action="store_true", help="then a second client on the same directory: "
                    "does it find the first one's files (a restarted worker)?")
    ap.add_argument("--restart-after-s", type=float, default=12.0)
    ap.add_argument("--offload-on-evict", action="store_true", help="the master copies a page to disk as it "
                    "evicts it from DRAM, instead of after every write (store.ssd_offload_on_evict)")
    args = ap.parse_args()

    from store_client.master import MasterProcess

    tmp = tempfile.mkdtemp(prefix="pdorch_ssd_")
    ssd = os.path.join(tmp, "ssd")
    os.makedirs(ssd)
    if args.backend:
        os.environ["MOONCAKE_OFFLOAD_STORAGE_BACKEND_DESCRIPTOR"] = args.backend
    os.environ.setdefault("MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS", "1")
    with MasterProcess(log_dir=tmp, enable_offload=True, kv_lease_ttl_ms=args.lease_ms,
                       offload_on_evict=args.offload_on_evict) as master:
        where = (master.metadata_url, master.master_address, ssd, args)
        ctx = multiprocessing.get_context("spawn")  # each client in a process of its own, as a worker
        with ctx.Pool(1) as pool:
            result = pool.apply(first_client, where)
        result["master"] = master_counters(master.metrics_text())
        if args.restart:  # the first client's process has exited: a worker gone, its directory kept
            time.sleep(args.restart_after_s)
            with ctx.Pool(1) as pool:
                result["restart"] = pool.apply(read_again, where)
            result["master_after_restart"] = master_counters(master.metrics_text())
    print(json.dumps({"settings": {**vars(args), "ssd_path": ssd}, **result}, indent=1))


def first_client(metadata_url: str, master_address: str, ssd: str, args) -> dict:
    """Write every page (a refused write is retried), wait, read them all back; the numbers."""
    if args.backend:
        os.environ["MOONCAKE_OFFLOAD_STORAGE_BACKEND_DESCRIPTOR"] = args.backend
    os.environ.setdefault("MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS", "1")
    page = args.page_kb << 10
    data = np.random.default_rng(1).integers(0, 256, size=(args.pages, page), dtype=np.uint8)
    back = np.zeros_like(data)
    keys = [f"ssd-bench/{i}" for i in range(args.pages)]
    store = setup_client(metadata_url, master_address, ssd, args.segment_mb)
    store.register_buffer(data.ctypes.data, data.nbytes)
    store.register_buffer(back.ctypes.data, back.nbytes)
    put_codes = []
    t0 = time.perf_counter()
    for i in range(0, args.pages, args.chunk):
        idx = range(i, min(i + args.chunk, args.pages))
        for _ in range(args.retries + 1):  # the master evicts in the background; a full segment refuses
            codes = store.batch_put_from([keys[j] for j in idx], [data.ctypes.data + j * page for j in idx],
                                         [page] * len(idx))
            if all(c == 0 for c in codes):
                break
            time.sleep(0.2)
        put_codes += codes
    put_s = time.perf_counter() - t0
    time.sleep(args.wait_s)
    files = [os.path.join(r, f) for r, _, fs in os.walk(ssd) for f in fs]
    exist = store.batch_is_exist(keys)
    t0 = time.perf_counter()
    got = store.batch_get_into(keys, [back.ctypes.data + j * page for j in range(args.pages)], [page] * args.pages)
    get_s = time.perf_counter() - t0
    equal = [bool(g == page and np.array_equal(back[j], data[j])) for j, g in enumerate(got)]
    rpc_reads = store.get_offload_rpc_read_count()
    store.close()
    return {"puts_ok": sum(c == 0 for c in put_codes), "put_codes": sorted(set(put_codes)),
            "put_s": round(put_s, 3), "exist": sum(c == 1 for c in exist), "read_equal": sum(equal),
            "get_codes": sorted(set(got)), "get_s": round(get_s, 4), "files": len(files),
            "file_bytes": sum(os.path.getsize(f) for f in files),
            "file_sample": [os.path.relpath(f, ssd) for f in files[:3]], "offload_rpc_reads": rpc_reads}


if __name__ == "__main__":
    main()
