"""The SSD case of bench/store_io/run.py (`--ssd`): loading pages that live only in Mooncake's SSD tier.

Setup (docs/workers.md, "The SSD tier"): a master with offload on and 1 s leases; a peer process
that owns the only DRAM segment (small: --ssd-segment-mb) with the SSD tier on in a directory of its
own (file-per-key backend, 1 s offload heartbeat). The peer writes --ssd-pages pages (1,456 x 737,280
B = 1.07 GB, a refused -200 write retried); its segment holds few of them, so the master drops the
others' DRAM copies once they are on disk. This process, a pure client as a worker reading another
worker's pages, counts the disk-only keys with batch_get_replica_desc.

Then one unmeasured idle pass (the peer settles after its writes: a first measurement took its
CPU), and interleaved (the order rotated each run), medians of --runs, the files' page cache
dropped before each measurement:
  ssd idle          store_client (StoreIO -> KVStore) loads every page once, the scheduler idle
  ssd under load    the same while the CPU-bound Python scheduler loop runs in this process
  ssd + outproc     the same while that loop runs in another process (CPU contention, no GIL)
  sequential read   the control, the disk's own limit: open + readinto of the same files in order

NOTE: a disk-only object is read by the segment owner's offload RPC server, in the PEER process
(which reads the file and sends the bytes over TCP), not by this one: this process's GIL is taken
only when each batch_get_into returns, as for DRAM reads.

    python bench/store_io/ssd.py --peer MASTER METADATA SEGMENT_MB DIR PAGES   (the peer process)
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # NOTE: first, as in bench/store_io/run.py

from bench.store_io.children import PAGE_NBYTES, drive_loads, spawn_child, stop_child

WRITE_CHUNK = 8  # pages per batch_put_from, as bench/store_io/ssd_offload.py
# The read lease, as --preset ssd sets it. NOTE: 200 ms failed loads when the machine was busy: in a
# batch mixing DRAM and disk pages Mooncake fails the DRAM ones (LEASE_EXPIRED, "lease expired before
# data transfer completed") when the whole batch outlasts the lease; such batches took 0.2-0.6 s here.
SSD_LEASE_MS = 1000
OS_PAGE = os.sysconf("SC_PAGE_SIZE")


def page_bytes(i: int) -> np.ndarray:
    """Page i's content: one random page rotated by i (distinct per page, cheap to regenerate)."""
    base = np.random.default_rng(11).integers(0, 256, size=PAGE_NBYTES, dtype=np.uint8)
    return np.roll(base, i * 97)


def page_key(i: int) -> str:
    return f"bench-store-io-ssd/{i}"


# ---------------------------------------------------------------------------------- the peer
def peer_process(master: str, metadata: str, segment_mb: int, ssd_dir: str, pages: int) -> None:
    """`--peer`: the segment owner with the SSD tier; writes the pages, prints their numbers, holds."""
    from mooncake.store import MooncakeDistributedStore

    from store_client.config import StoreConfig
    from store_client.connector import ssd_environment

    ssd_environment(StoreConfig(ssd_path=ssd_dir, ssd_offload_interval_s=1))
    os.makedirs(ssd_dir, exist_ok=True)
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", metadata, segment_mb << 20, 16 << 20, "tcp", "", master,
                 enable_ssd_offload=True, ssd_offload_path=ssd_dir)
    print("ready" if rc == 0 else f"setup failed {rc}", flush=True)
    buf = np.zeros((WRITE_CHUNK, PAGE_NBYTES), dtype=np.uint8)
    s.register_buffer(buf.ctypes.data, buf.nbytes)
    written, retries, t0 = 0, 0, time.perf_counter()
    for first in range(0, pages, WRITE_CHUNK):
        idx = range(first, min(first + WRITE_CHUNK, pages))
        for j, i in enumerate(idx):
            buf[j] = page_bytes(i)
        deadline = time.monotonic() + 30  # the master evicts in the background; a full segment refuses
        while True:
            codes = s.batch_put_from([page_key(i) for i in idx], [buf.ctypes.data + j * PAGE_NBYTES
                                                                  for j in range(len(idx))], [PAGE_NBYTES] * len(idx))
            if all(c == 0 for c in codes) or time.monotonic() > deadline:
                break
            retries += 1
            time.sleep(0.2)
        written += sum(c == 0 for c in codes)
    put_s = time.perf_counter() - t0
    time.sleep(3)  # the last pages' offload (1 s heartbeat) and leases, then the master's eviction
    print(json.dumps({"written": written, "put_s": put_s, "put_retries": retries}), flush=True)
    sys.stdin.read()
    s.close()


# ---------------------------------------------------------------------------------- pure helpers
def tier_counts(descs: dict, keys) -> dict[str, int]:
    """How many keys are disk-only, have a DRAM copy, or have no complete replica (the master's view)."""
    from store_client.replica_tier import _complete, on_disk_only

    out = {"disk_only": 0, "in_dram": 0, "absent": 0}
    for k in keys:
        reps = [r for r in descs.get(k) or () if _complete(r)]
        if on_disk_only(reps):
            out["disk_only"] += 1
        elif any(r.is_memory_replica() for r in reps):
            out["in_dram"] += 1
        else:
            out["absent"] += 1
    return out


def summarize(samples: dict[str, list[float]], nbytes: int) -> dict:
    """Medians (bytes/s) and the ratios: under_load / idle (target >= 0.8), idle / sequential read."""
    med = {k: statistics.median(v) for k, v in samples.items() if v}
    return {
        "ssd_bytes": nbytes, "ssd_idle_bytes_s": med["ssd_idle"], "ssd_under_load_bytes_s": med["ssd_under_load"],
        "ssd_outproc_loop_bytes_s": med["ssd_outproc"], "sequential_read_bytes_s": med["sequential"],
        "ssd_loop_it_s": med["loop_it_s"], "ssd_idle_cores": med["ssd_idle_cores"], "cpu_cores": os.cpu_count(),
        # Core-seconds per GB loaded, this process + the peer (what the loop's core is taken from).
        "ssd_idle_cpu_s_per_gb": med["ssd_idle_cores"] / med["ssd_idle"] * 1e9,
        "ssd_under_load_cpu_s_per_gb": med["ssd_under_load_io_cores"] / med["ssd_under_load"] * 1e9,
        "ssd_idle_other_cores": med["ssd_idle_other_cores"],
        "ssd_under_load_io_cores": med["ssd_under_load_io_cores"],
        "ssd_under_load_loop_cores": med["ssd_under_load_loop_cores"],
        "ssd_under_load_other_cores": med["ssd_under_load_other_cores"],
        # The CPU bound: the cores the loop and the rest of the machine left, at the idle loads' cost per
        # byte, against the idle rate (1.0: the CPU left does not bound the loads).
        "ssd_cpu_bound_ratio": min(1.0, cpu_left_bytes_s(med) / med["ssd_idle"]),
        "ssd_under_load_ratio": med["ssd_under_load"] / med["ssd_idle"],
        "ssd_gil_ratio": med["ssd_under_load"] / med["ssd_outproc"],
        "ssd_idle_vs_sequential_ratio": med["ssd_idle"] / med["sequential"],
        "ssd_samples": samples,
    }


def machine_busy_seconds() -> float:
    """CPU seconds all cores have been busy so far, every process and the kernel (/proc/stat)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def cpu_left_bytes_s(med: dict) -> float:
    """Bytes/s the loads could reach under the loop if CPU were their only limit: the cores left
    (all, less the loop's thread and the rest of the machine) at the idle loads' core-s per byte."""
    left = os.cpu_count() - med["ssd_under_load_loop_cores"] - med["ssd_under_load_other_cores"]
    return max(0.0, left) / (med["ssd_idle_cores"] / med["ssd_idle"])


def cpu_seconds(pid: int | str = "self") -> float:
    """User + system CPU seconds a process (all its threads) has used so far (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()  # NOTE: after the name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------------- page cache
def drop_page_cache(paths) -> bool:
    """fsync + POSIX_FADV_DONTNEED on every file: the next read goes to the disk. True if it worked."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)  # NOTE: dirty pages are not dropped; the peer's writes may still be dirty
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return resident_bytes(paths) == 0


def resident_bytes(paths) -> int:
    """Bytes of these files in the page cache (mincore on a private mapping of each)."""
    libc = ctypes.CDLL(None, use_errno=True)
    total = 0
    for p in paths:
        size = os.path.getsize(p)
        if size == 0:
            continue
        n = (size + OS_PAGE - 1) // OS_PAGE
        vec = (ctypes.c_ubyte * n)()
        with open(p, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as m:
            ptr = ctypes.c_char.from_buffer(m)
            rc = libc.mincore(ctypes.c_void_p(ctypes.addressof(ptr)), ctypes.c_size_t(size), vec)
            del ptr  # NOTE: the mapping cannot close while a ctypes view of it exists
        if rc != 0:
            raise OSError(ctypes.get_errno(), "mincore failed")
        total += sum(b & 1 for b in vec) * OS_PAGE
    return total


def sequential_read_bytes_s(paths) -> float:
    """The control: each file read whole, in order, into one reused buffer (Python open + readinto)."""
    buf = bytearray(8 << 20)
    view, nbytes, t0 = memoryview(buf), 0, time.perf_counter()
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while n := f.readinto(view):
                nbytes += n
    return nbytes / (time.perf_counter() - t0)


# ---------------------------------------------------------------------------------- the case
class SsdCase:
    """The peer, its files and this process's store_client, for the measurements above."""

    def __init__(self, master, args, workdir: str):
        from prometheus_client import CollectorRegistry

        from store_client.config import StoreConfig
        from store_client.io_thread import StoreIO
        from store_client.metrics import StoreMetrics
        from store_client.store import KVStore

        self.pages, self.batch, self.depth = args.ssd_pages, args.batch, args.in_flight
        self.ssd_dir = os.path.join(workdir, "peer-ssd")
        self.peer = spawn_child(["--peer", master.master_address, master.metadata_url, str(args.ssd_segment_mb),
                                 self.ssd_dir, str(self.pages)], script=__file__)
        line = self.peer.stdout.readline()  # deadline: 30 s a chunk in the peer
        if not line.startswith("{"):
            stop_child(self.peer)
            raise RuntimeError(f"the SSD peer failed writing the pages: {line!r}")
        self.write = json.loads(line)
        self.keys = [page_key(i) for i in range(self.pages)]
        self.dst = np.zeros((self.pages, PAGE_NBYTES), dtype=np.uint8)
        # NOTE: ssd_path makes KVStore attribute each page to its tier (one replica lookup per load),
        # as on a worker with the SSD tier; segment 0: this process's own directory stays empty.
        cfg = StoreConfig(master_address=master.master_address, metadata_server=master.metadata_url,
                          global_segment_size_mb=0, local_buffer_size_mb=16, io_threads=args.io_threads,
                          ssd_path=os.path.join(workdir, "reader-ssd"))
        self.store = KVStore(cfg, PAGE_NBYTES, StoreMetrics(CollectorRegistry()), component="reader")
        self.store.register_buffer(self.dst.ctypes.data, self.dst.nbytes)
        if not self.store.wait_enabled(30):
            raise RuntimeError("store_client did not connect")
        self.io = StoreIO(self.store)
        self.files = sorted(os.path.join(r, f) for r, _, fs in os.walk(self.ssd_dir) for f in fs)
        self.file_bytes = sum(os.path.getsize(f) for f in self.files)

    def close(self) -> None:
        self.io.close()
        self.store.close()
        stop_child(self.peer)

    def tiers(self) -> dict[str, int]:
        return tier_counts(self.store.raw_client().batch_get_replica_desc(self.keys), self.keys)

    def check(self) -> None:
        for i in range(self.pages):
            if not np.array_equal(self.dst[i], page_bytes(i)):
                raise RuntimeError(f"page {i} loaded from the SSD tier differs from the one written")

    def load_all(self, with_loop: bool) -> tuple[float, float, int, float]:
        """Every page once, --batch pages a load, --in-flight loads queued.

        Returns (bytes/s, loop it/s, pages from the SSD tier, cores: {"io": busy in this process and
        the peer, the loop's thread excepted; "loop": the loop's thread; "other": the rest of the
        machine, the master, the kernel and any process outside the bench}).
        """
        loads = (([self.keys[i] for i in idx], [self.dst.ctypes.data + i * PAGE_NBYTES for i in idx])
                 for idx in (range(f, min(f + self.batch, self.pages)) for f in range(0, self.pages, self.batch)))
        ours0, all0 = cpu_seconds() + cpu_seconds(self.peer.pid), machine_busy_seconds()
        t0 = time.perf_counter()
        gbps, its, ssd, loop = drive_loads(self.io, loads, self.depth, with_loop)
        dt = time.perf_counter() - t0
        ours = (cpu_seconds() + cpu_seconds(self.peer.pid) - ours0) / dt
        cores = {"io": ours - loop, "loop": loop, "other": (machine_busy_seconds() - all0) / dt - ours}
        return gbps * 1e9, its, ssd, cores

    def load_all_outproc_loop(self) -> float:
        busy = spawn_child(["--busy-loop", "600"])  # stopped below, when the loads are done
        try:
            return self.load_all(with_loop=False)[0]  # NOTE: its cores' "other" holds the busy loop
        finally:
            busy.kill()
            busy.wait(timeout=10)


def run_ssd(args) -> dict:
    """Its own master (offload on, short leases), the case, --runs interleaved measurements: the summary."""
    import tempfile

    from store_client.master import MasterProcess

    with tempfile.TemporaryDirectory(prefix="store_io_ssd_") as workdir, \
            MasterProcess(log_dir=workdir, kv_lease_ttl_ms=SSD_LEASE_MS, enable_offload=True) as master:
        case = SsdCase(master, args, workdir)
        try:
            return measure(case, args.runs, args.json)
        finally:
            case.close()


def measure(case: SsdCase, runs: int, quiet: bool) -> dict:
    before = case.tiers()
    samples: dict[str, list[float]] = {k: [] for k in (
        "ssd_idle", "ssd_under_load", "ssd_outproc", "sequential", "loop_it_s", "ssd_pages_per_load", "ssd_idle_cores",
        "ssd_idle_other_cores", "ssd_under_load_io_cores", "ssd_under_load_loop_cores", "ssd_under_load_other_cores")}
    dropped = []

    def idle():
        case.dst[:] = 0
        bps, _, ssd, cores = case.load_all(with_loop=False)
        case.check()
        samples["ssd_idle"].append(bps)
        samples["ssd_idle_cores"].append(cores["io"] + cores["loop"])
        samples["ssd_idle_other_cores"].append(cores["other"])
        samples["ssd_pages_per_load"].append(ssd)

    def under_load():
        bps, its, ssd, cores = case.load_all(with_loop=True)
        samples["ssd_under_load"].append(bps)
        samples["loop_it_s"].append(its)
        for k in ("io", "loop", "other"):
            samples[f"ssd_under_load_{k}_cores"].append(cores[k])
        samples["ssd_pages_per_load"].append(ssd)

    def outproc():
        samples["ssd_outproc"].append(case.load_all_outproc_loop())

    def sequential():
        samples["sequential"].append(sequential_read_bytes_s(case.files))

    order = [sequential, idle, under_load, outproc]
    drop_page_cache(case.files)
    case.load_all(with_loop=False)  # unmeasured: see the module's docstring
    for r in range(runs):
        for measurement in order[r % 4:] + order[:r % 4]:  # NOTE: rotated: no case is always first
            dropped.append(drop_page_cache(case.files))
            measurement()
        if not quiet:
            print(f"ssd run {r + 1}/{runs}: " + ", ".join(f"{k}={v[-1]:.3g}" for k, v in samples.items()),
                  file=sys.stderr)
    res = summarize(samples, case.pages * PAGE_NBYTES)
    res.update({"ssd_pages": case.pages, "ssd_write": case.write, "ssd_files": len(case.files),
                "ssd_file_bytes": case.file_bytes, "ssd_tiers_before": before, "ssd_tiers_after": case.tiers(),
                "ssd_page_cache_dropped": all(dropped),
                "ssd_offload_rpc_reads": case.store.raw_client().get_offload_rpc_read_count()})
    return res


def ssd_rows(res: dict) -> list[tuple[str, str, str]]:
    """bench/store_io/run.py's table rows for the SSD case."""
    t = res["ssd_tiers_before"]

    def gb(key: str) -> str:
        return f"{res[key] / 1e9:.2f} GB/s"

    return [
        (f"(7) SSD: {res['ssd_pages']} pages, {res['ssd_bytes'] / 1e9:.2f} GB", "",
         (f"disk-only {t['disk_only']}, in DRAM {t['in_dram']}, absent {t['absent']}; page cache dropped: "
          f"{'yes' if res['ssd_page_cache_dropped'] else 'NO'}")),
        ("    store_client load from SSD, loop idle", gb("ssd_idle_bytes_s"),
         (f"vs sequential read x{res['ssd_idle_vs_sequential_ratio']:.2f}; {res['ssd_idle_cores']:.2f} of "
          f"{res['cpu_cores']} cores busy (here + peer), {res['ssd_idle_cpu_s_per_gb']:.2f} core-s/GB")),
        ("    store_client load from SSD + in-process loop", gb("ssd_under_load_bytes_s"),
         f"under load / idle = {res['ssd_under_load_ratio']:.2f}  (target >= 0.8)"),
        ("    cores under load: loads / loop thread / rest", "",
         (f"{res['ssd_under_load_io_cores']:.2f} / {res['ssd_under_load_loop_cores']:.2f} / "
          f"{res['ssd_under_load_other_cores']:.2f} of {res['cpu_cores']} (idle: rest {res['ssd_idle_other_cores']:.2f}); "
          f"loads {res['ssd_under_load_cpu_s_per_gb']:.2f} core-s/GB")),
        ("    CPU bound: cores left / idle core-s per byte", "",
         f"x{res['ssd_cpu_bound_ratio']:.2f} of idle"),
        ("    store_client load from SSD + loop in other process", gb("ssd_outproc_loop_bytes_s"),
         f"in-process / other process = {res['ssd_gil_ratio']:.2f}"),
        ("    sequential read of the same files (the disk)", gb("sequential_read_bytes_s"), ""),
    ]


if __name__ == "__main__":
    if len(sys.argv) != 7 or sys.argv[1] != "--peer":
        sys.exit(__doc__)
    peer_process(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], int(sys.argv[6]))
