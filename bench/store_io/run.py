"""Store I/O benchmark: does store_client keep Mooncake's bandwidth while a Python scheduler runs?

Side by side in one run, on SmolLM2-135M-sized pages (30 layers x 2 x 3 kv heads x 16 tokens x 64
x fp32 = 737,280 bytes), with the objects in another process's segment (TCP loopback):

  (1) raw      raw `batch_get_into` bandwidth, nothing else running
  (2) idle     store_client (StoreIO -> KVStore) load bandwidth, the scheduler thread idle
  (3) inproc   store_client load bandwidth while a CPU-bound Python scheduler loop runs in this process
  (4) outproc  raw `batch_get_into` while the same loop runs in a separate process (CPU contention
               floor on 2 cores, no GIL involved)
  (5) loop     scheduler loop iterations/s alone vs with loads in flight; controls without a shared
               GIL: the loop in another process during (4), and this loop while another process loads
  (6) per-page the seeds' pattern: one Python allocation + one file open/readinto + one copy per
               page, on a thread, under the same in-process loop
  (7) SSD      with --ssd (--ssd-only: alone): ~1 GB of pages only on Mooncake's SSD tier, loaded by
               store_client with the loop idle, under the in-process loop, with the loop in another
               process, and the control: a plain sequential read of the same files (bench/store_io/ssd.py)
  (8) heads    with --head-groups 1,2,4,8 (--head-groups-only: alone): a page stored as G objects, one
               per group of KV heads, against one object per page (bench/store_io/head_groups.py)

(1) and (4) are one caller issuing one 32-page call at a time. (2) and (3) keep --in-flight loads
(default 4: a busy prefill scheduler has several requests loading) queued on StoreIO, which merges
queued loads into one call and runs 2 I/O threads (store.io_threads), as the workers do.

Headline ratios: (2)/(1), gil_ratio = (3)/(4), loop_slowdown_ratio = 1 - loop_with/loop_alone.
Each measurement is repeated --runs times (interleaved, so machine noise hits all alike); the
table shows medians. `--json` prints one JSON object as the last line. No torch.

    python bench/store_io/run.py [--runs 3] [--seconds 2] [--ssd | --ssd-only] [--head-groups 1,2,4,8
                             [--head-groups-only]] [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
# NOTE: first, unconditionally: ahead of this script's own folder, whose modules must not shadow the project's.
sys.path.insert(0, str(ROOT))

from bench.store_io.children import PAGE_NBYTES, drive_loads, loop_iteration, spawn_child, stop_child
from bench.store_io.head_groups import PAGE_NBYTES as HEAD_GROUP_PAGE_NBYTES
from bench.store_io.head_groups import head_group_rows, run_head_groups
from bench.store_io.ssd import run_ssd, ssd_rows


# ---------------------------------------------------------------------------------- measurements
class Bench:
    def __init__(self, master, pages: int, batch: int, seconds: float, segment_holder: subprocess.Popen,
                 io_threads: int = 1):
        from mooncake.store import MooncakeDistributedStore
        from prometheus_client import CollectorRegistry

        from store_client.config import StoreConfig
        from store_client.io_thread import StoreIO
        from store_client.metrics import StoreMetrics
        from store_client.store import KVStore

        self.pages, self.batch, self.seconds = pages, batch, seconds
        self.holder = segment_holder
        self.src = np.random.default_rng(0).integers(0, 256, size=(pages, PAGE_NBYTES), dtype=np.uint8)
        self.dst = np.zeros_like(self.src)
        self.keys = [f"bench-store-io/{i}" for i in range(pages)]
        # Pure clients (segment 0): every object lives in the holder process, as in a cluster.
        cfg = StoreConfig(master_address=master.master_address, metadata_server=master.metadata_url,
                          global_segment_size_mb=0, local_buffer_size_mb=16, io_threads=io_threads)
        self.raw = MooncakeDistributedStore()
        if self.raw.setup("127.0.0.1", master.metadata_url, 0, 16 << 20, "tcp", "", master.master_address):
            raise RuntimeError("raw client setup failed")
        for buf in (self.src, self.dst):
            self.raw.register_buffer(buf.ctypes.data, buf.nbytes)
        self.store = KVStore(cfg, PAGE_NBYTES, StoreMetrics(CollectorRegistry()))
        self.store.register_buffer(self.dst.ctypes.data, self.dst.nbytes)
        if not self.store.wait_enabled(30):
            raise RuntimeError("store_client did not connect")
        self.io = StoreIO(self.store)
        codes = self.raw.batch_put_from(self.keys, self._addrs(self.src, range(pages)), [PAGE_NBYTES] * pages)
        if any(c != 0 for c in codes):
            raise RuntimeError(f"writing the pages failed: {sorted(set(codes))}")
        self.batches = [list(range(i, min(i + batch, pages))) for i in range(0, pages, batch)]
        self.tmp = tempfile.TemporaryDirectory(prefix="store_io_pages_")
        self.files = []
        for i in range(min(pages, 32)):
            path = os.path.join(self.tmp.name, f"page_{i}")
            self.src[i].tofile(path)
            self.files.append(path)

    @staticmethod
    def _addrs(arr: np.ndarray, idx) -> list[int]:
        return [arr.ctypes.data + i * PAGE_NBYTES for i in idx]

    def close(self) -> None:
        self.io.close()
        self.store.close()
        self.raw.close()
        self.tmp.cleanup()

    def check(self) -> None:
        if not np.array_equal(self.dst, self.src):
            raise RuntimeError("loaded bytes differ from the written pages")

    # (1) and (4)
    def raw_gbps(self) -> float:
        nbytes, n, t0 = 0, 0, time.perf_counter()
        while time.perf_counter() - t0 < self.seconds:
            idx = self.batches[n % len(self.batches)]
            codes = self.raw.batch_get_into([self.keys[i] for i in idx], self._addrs(self.dst, idx),
                                            [PAGE_NBYTES] * len(idx))
            if any(c != PAGE_NBYTES for c in codes):
                raise RuntimeError(f"raw batch_get_into failed: {sorted(set(codes))}")
            nbytes += PAGE_NBYTES * len(idx)
            n += 1
        return nbytes / (time.perf_counter() - t0) / 1e9

    def raw_outproc_gbps(self) -> tuple[float, float]:
        """(raw GB/s, the other process's loop it/s) while both run."""
        busy = spawn_child(["--busy-loop", str(self.seconds)])
        try:
            gbps = self.raw_gbps()
            its = float(busy.stdout.readline())
        finally:
            stop_child(busy)
        return gbps, its

    # (2), (3) and (5)
    def client_gbps(self, with_loop: bool, depth: int) -> tuple[float, float]:
        """Loads through StoreIO, `depth` in flight; returns (GB/s, scheduler loop iterations/s)."""
        loads = (([self.keys[i] for i in idx], self._addrs(self.dst, idx)) for idx in itertools.cycle(self.batches))
        return drive_loads(self.io, loads, depth, with_loop, self.seconds)[:2]

    def loop_with_outproc_loads(self, master) -> tuple[float, float]:
        """(this process's loop it/s, GB/s) while ANOTHER process runs raw loads: CPU cost, no GIL."""
        loader = spawn_child(["--raw-loader", master.master_address, master.metadata_url, str(self.seconds),
                         str(self.pages), str(self.batch)])
        try:
            loader.stdin.write("go\n")
            loader.stdin.flush()
            its = self.loop_alone()
            gbps = float(loader.stdout.readline())
        finally:
            stop_child(loader)
        return its, gbps

    def loop_alone(self) -> float:
        state, its, t0 = {"table": {}}, 0, time.perf_counter()
        while time.perf_counter() - t0 < self.seconds:
            loop_iteration(state)
            its += 1
        return its / (time.perf_counter() - t0)

    # (6)
    def per_page_gbps(self, with_loop: bool = True) -> float:
        """Seed pattern on a thread: per page a Python allocation, open + readinto, and a copy."""
        stop = threading.Event()
        count = [0]

        def reader():
            i = 0
            while not stop.is_set():
                k = i % len(self.files)
                buf = bytearray(PAGE_NBYTES)
                with open(self.files[k], "rb") as f:
                    f.readinto(buf)
                self.dst[k] = np.frombuffer(buf, dtype=np.uint8)
                count[0] += 1
                i += 1

        t = threading.Thread(target=reader, daemon=True)
        state = {"table": {}}
        t0 = time.perf_counter()
        t.start()
        while time.perf_counter() - t0 < self.seconds:
            if with_loop:
                loop_iteration(state)
            else:
                time.sleep(0.01)
        stop.set()
        t.join(timeout=30)
        return count[0] * PAGE_NBYTES / (time.perf_counter() - t0) / 1e9


def run(args) -> dict:
    from store_client.master import MasterProcess

    with tempfile.TemporaryDirectory(prefix="store_io_master_") as logs:
        master = MasterProcess(log_dir=logs).start()
        holder = None
        bench = None
        try:
            segment_mb = max(64, (args.pages * PAGE_NBYTES >> 20) * 2)
            holder = spawn_child(["--hold-segment", master.master_address, master.metadata_url, str(segment_mb)])
            bench = Bench(master, args.pages, args.batch, args.seconds, holder, args.io_threads)
            samples: dict[str, list[float]] = {k: [] for k in (
                "raw", "idle", "inproc", "loop_with", "outproc", "loop_outproc", "loop_alone", "loop_ext_loads",
                "ext_loads", "per_page", "per_page_alone")}
            for r in range(args.runs):
                samples["raw"].append(bench.raw_gbps())
                bench.dst[:] = 0
                samples["idle"].append(bench.client_gbps(with_loop=False, depth=args.in_flight)[0])
                bench.check()
                gbps, its = bench.client_gbps(with_loop=True, depth=args.in_flight)
                samples["inproc"].append(gbps)
                samples["loop_with"].append(its)
                gbps, its = bench.raw_outproc_gbps()
                samples["outproc"].append(gbps)
                samples["loop_outproc"].append(its)
                samples["loop_alone"].append(bench.loop_alone())
                its, gbps = bench.loop_with_outproc_loads(master)
                samples["loop_ext_loads"].append(its)
                samples["ext_loads"].append(gbps)
                samples["per_page"].append(bench.per_page_gbps(with_loop=True))
                samples["per_page_alone"].append(bench.per_page_gbps(with_loop=False))
                if not args.json:
                    print(f"run {r + 1}/{args.runs}: " + ", ".join(f"{k}={v[-1]:.3f}" for k, v in samples.items()),
                          file=sys.stderr)
        finally:
            if bench is not None:
                bench.close()
            if holder is not None:
                stop_child(holder)
            master.stop()
    med = {k: statistics.median(v) for k, v in samples.items()}
    return {
        "page_nbytes": PAGE_NBYTES, "pages_per_batch": args.batch, "pages": args.pages, "runs": args.runs,
        "seconds_per_measurement": args.seconds, "io_threads": args.io_threads, "loads_in_flight": args.in_flight,
        "raw_gbps": med["raw"], "client_idle_gbps": med["idle"], "client_inproc_load_gbps": med["inproc"],
        "raw_outproc_load_gbps": med["outproc"], "per_page_baseline_gbps": med["per_page"],
        "idle_ratio": med["idle"] / med["raw"], "gil_ratio": med["inproc"] / med["outproc"],
        "loop_alone_it_s": med["loop_alone"], "loop_with_loads_it_s": med["loop_with"],
        "loop_slowdown_ratio": 1.0 - med["loop_with"] / med["loop_alone"],
        "loop_outproc_with_raw_loads_it_s": med["loop_outproc"],
        "loop_outproc_slowdown_ratio": 1.0 - med["loop_outproc"] / med["loop_alone"],
        # Loop slowdown per GB/s moved: in-process (GIL + CPU) vs other process (CPU only).
        "loop_slowdown_per_gbps": (1.0 - med["loop_with"] / med["loop_alone"]) / med["inproc"],
        "loop_outproc_slowdown_per_gbps": (1.0 - med["loop_outproc"] / med["loop_alone"]) / med["outproc"],
        "loop_with_outproc_loads_it_s": med["loop_ext_loads"], "outproc_loader_gbps": med["ext_loads"],
        "loop_outproc_loads_slowdown_ratio": 1.0 - med["loop_ext_loads"] / med["loop_alone"],
        "loop_outproc_loads_slowdown_per_gbps": (1.0 - med["loop_ext_loads"] / med["loop_alone"]) / med["ext_loads"],
        "per_page_alone_gbps": med["per_page_alone"],
        "per_page_loop_ratio": med["per_page"] / med["per_page_alone"],
        "client_loop_ratio": med["inproc"] / med["idle"],
        "per_page_vs_inproc_ratio": med["per_page"] / med["inproc"],
        "samples": samples,
    }


def run_with_holder(measure, nbytes: int) -> dict:
    """`measure(master)` with a master and a segment-holder process of room for `nbytes` twice."""
    from store_client.master import MasterProcess

    with tempfile.TemporaryDirectory(prefix="store_io_master_") as logs:
        master = MasterProcess(log_dir=logs).start()
        holder = spawn_child(["--hold-segment", master.master_address, master.metadata_url,
                              str(max(64, (nbytes >> 20) * 2))])
        try:
            return measure(master)
        finally:
            stop_child(holder)
            master.stop()


def table(res: dict) -> str:
    rows = dram_rows(res) if "raw_gbps" in res else []
    rows += ssd_rows(res) if "ssd_idle_bytes_s" in res else []
    rows += head_group_rows(res) if "head_groups" in res else []
    w = max(len(r[0]) for r in rows)
    head = (f"pages of {res['page_nbytes']} B ((8): {HEAD_GROUP_PAGE_NBYTES} B), {res['pages_per_batch']} pages per load, "
            f"{res['loads_in_flight']} loads in flight, {res['io_threads']} I/O threads, medians of {res['runs']} runs"
            + (f" x {res['seconds_per_measurement']} s" if "raw_gbps" in res else ""))
    return "\n".join([head] + [f"{a:<{w}}  {b:>14}  {c}" for a, b, c in rows])


def dram_rows(res: dict) -> list[tuple[str, str, str]]:
    return [
        ("(1) raw batch_get_into, idle", f"{res['raw_gbps']:.2f} GB/s", ""),
        ("(2) store_client load, worker idle", f"{res['client_idle_gbps']:.2f} GB/s",
         f"(2)/(1) = {res['idle_ratio']:.2f}  (target >= 0.9)"),
        ("(3) store_client load + in-process loop", f"{res['client_inproc_load_gbps']:.2f} GB/s",
         f"(3)/(4) = {res['gil_ratio']:.2f}  (target >= 0.8)"),
        ("(4) raw batch_get_into + loop in other process", f"{res['raw_outproc_load_gbps']:.2f} GB/s", ""),
        ("(5) loop it/s alone -> with loads", f"{res['loop_alone_it_s']:.0f} -> {res['loop_with_loads_it_s']:.0f}",
         f"slowdown = {res['loop_slowdown_ratio']:.0%}  (target < 30%)"),
        ("    loop it/s in the other process during (4)", f"{res['loop_outproc_with_raw_loads_it_s']:.0f}",
         f"slowdown = {res['loop_outproc_slowdown_ratio']:.0%}  (CPU contention alone)"),
        ("    loop it/s here while another process loads", f"{res['loop_with_outproc_loads_it_s']:.0f}",
         (f"slowdown = {res['loop_outproc_loads_slowdown_ratio']:.0%} at {res['outproc_loader_gbps']:.2f} GB/s "
         "(no GIL shared)")),
        ("    loop slowdown per GB/s: (5) / the two controls", "",
         (f"{res['loop_slowdown_per_gbps']:.2f} / {res['loop_outproc_slowdown_per_gbps']:.2f} / "
         f"{res['loop_outproc_loads_slowdown_per_gbps']:.2f}")),
        ("(6) per-page alloc+open+readinto+copy + loop", f"{res['per_page_baseline_gbps']:.2f} GB/s",
         f"vs {res['per_page_alone_gbps']:.2f} GB/s without the loop: x{res['per_page_loop_ratio']:.2f}"),
        ("    store_client under the loop, (3)/(2)", "", f"x{res['client_loop_ratio']:.2f}"),
    ]


def run_all(args) -> dict:
    res = {} if (args.ssd_only or args.head_groups_only) else run(args)
    if args.ssd or args.ssd_only:
        res.update(run_ssd(args), ssd_segment_mb=args.ssd_segment_mb)
    if args.head_groups:
        res.update(run_with_holder(lambda master: run_head_groups(
            master, args.head_groups, args.pages, args.batch, args.seconds, args.runs),
            # NOTE: room for every G at once: a removed object stays until its read lease runs out
            args.pages * HEAD_GROUP_PAGE_NBYTES * (2 * len(args.head_groups) + 1)))
    res.update(page_nbytes=PAGE_NBYTES, pages_per_batch=args.batch, loads_in_flight=args.in_flight,
               io_threads=args.io_threads, runs=args.runs)
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3, help="repetitions; medians are reported")
    p.add_argument("--seconds", type=float, default=2.0, help="duration of each measurement")
    p.add_argument("--pages", type=int, default=128, help="distinct pages in the store")
    p.add_argument("--batch", type=int, default=32, help="pages per load (one request's prefix)")
    p.add_argument("--in-flight", type=int, default=4,
                   help="store_client loads kept in flight (requests a busy prefill scheduler has loading)")
    p.add_argument("--io-threads", type=int, default=None, help="StoreIO threads (default: store.io_threads)")
    p.add_argument("--ssd", action="store_true", help="also (7): loading pages only on the SSD tier")
    p.add_argument("--ssd-only", action="store_true", help="only (7), the SSD case")
    p.add_argument("--ssd-pages", type=int, default=1456, help="(7): pages written (1,456 = 1.07 GB)")
    p.add_argument("--ssd-segment-mb", type=int, default=64, help="(7): the DRAM segment in front of the disk")
    p.add_argument("--head-groups", type=lambda v: [int(x) for x in v.split(",")], default=[],
                   metavar="G,G,...", help="(8): a page as G objects per group of KV heads, e.g. 1,2,4,8 (the first is "
                   "the baseline; each must divide 8)")
    p.add_argument("--head-groups-only", action="store_true", help="only (8)")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = p.parse_args(argv)
    if args.head_groups_only and not args.head_groups:
        args.head_groups = [1, 2, 4, 8]
    if any(g < 1 or 8 % g for g in args.head_groups):
        p.error(f"--head-groups: each must divide 8, got {args.head_groups}")
    if args.io_threads is None:
        from store_client.config import StoreConfig
        args.io_threads = StoreConfig().io_threads
    for name in ("runs", "pages", "batch", "io_threads", "in_flight", "ssd_pages", "ssd_segment_mb"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    res = run_all(args)
    print(table(res))
    if args.json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
