"""The child processes of bench/store_io/run.py, each its own process so it has its own GIL, and the
pieces the bench's processes share (the page size, the scheduler loop, the load driver).

    python bench/store_io/children.py --busy-loop SECONDS          the scheduler loop, prints it/s
    python bench/store_io/children.py --hold-segment M META MB     holds the segment the objects live in
    python bench/store_io/children.py --raw-loader M META S P B    raw batch_get_into loads, prints GB/s

Each prints "ready" once set up; spawn_child() waits for it, stop_child() closes its stdin.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import time
from collections.abc import Iterable

import numpy as np

# SmolLM2-135M: 30 layers, K and V, 3 kv heads, 16-token pages, head_dim 64, fp32.
PAGE_NBYTES = 30 * 2 * 3 * 16 * 64 * 4
assert PAGE_NBYTES == 737_280


# ---------------------------------------------------------------------------------- scheduler loop
def loop_iteration(state: dict) -> None:
    """~0.3 ms of pure-Python bookkeeping, the kind a scheduler does per step (holds the GIL)."""
    table = state["table"]
    for i in range(400):
        k = i & 63
        table[k] = table.get(k, 0) + i


def drive_loads(io, loads: Iterable[tuple[list[str], list[int]]], depth: int, with_loop: bool,
                seconds: float = math.inf) -> tuple[float, float, int]:
    """Keep `depth` loads of `loads` in flight on StoreIO until it is exhausted or `seconds` passed.

    Returns (GB/s, scheduler loop iterations/s, pages read from the SSD tier, cores this thread
    used). with_loop: the CPU-bound loop runs on this thread between polls, else this thread sleeps
    in poll().
    """
    state, pending = {"table": {}}, iter(loads)
    nbytes, its, ssd_pages, submitted, exhausted = 0, 0, 0, 0, False
    cpu0, t0 = time.thread_time(), time.perf_counter()
    end = t0 + seconds
    while True:
        while submitted < depth and not exhausted and time.perf_counter() < end:
            load = next(pending, None)
            if load is None:
                exhausted = True
                break
            io.submit_load(len(load[0]), *load)
            submitted += 1
        if submitted == 0:
            break
        if with_loop:
            loop_iteration(state)
            its += 1
            done = io.poll()
        else:
            done = io.poll(timeout_s=0.5)
        for d in done:
            if d.pages_ok != d.tag:
                raise RuntimeError(f"store_client load failed: {d}")
            nbytes += d.pages_ok * PAGE_NBYTES
            ssd_pages += sum(d.page_ssd)
            submitted -= 1
    elapsed = time.perf_counter() - t0
    return nbytes / elapsed / 1e9, its / elapsed, ssd_pages, (time.thread_time() - cpu0) / elapsed


def busy_loop_process(seconds: float) -> None:
    """`--busy-loop`: the same loop in its own process (CPU contention without the GIL); prints it/s."""
    state, its = {"table": {}}, 0
    print("ready", flush=True)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        loop_iteration(state)
        its += 1
    print(its / (time.perf_counter() - t0), flush=True)


def hold_segment_process(master: str, metadata: str, segment_mb: int) -> None:
    """`--hold-segment`: contribute the memory the objects live in, until stdin closes."""
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", metadata, segment_mb << 20, 16 << 20, "tcp", "", master)
    print("ready" if rc == 0 else f"setup failed {rc}", flush=True)
    sys.stdin.read()
    s.close()


def raw_loader_process(master: str, metadata: str, seconds: float, pages: int, batch: int) -> None:
    """`--raw-loader`: after a line on stdin, raw loads for `seconds` in this separate process; prints GB/s."""
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", metadata, 0, 16 << 20, "tcp", "", master)
    dst = np.zeros((batch, PAGE_NBYTES), dtype=np.uint8)
    s.register_buffer(dst.ctypes.data, dst.nbytes)
    print("ready" if rc == 0 else f"setup failed {rc}", flush=True)
    sys.stdin.readline()
    keys = [f"bench-store-io/{i}" for i in range(pages)]
    addrs = [dst.ctypes.data + i * PAGE_NBYTES for i in range(batch)]
    nbytes, n, t0 = 0, 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        first = (n * batch) % pages
        idx = [(first + i) % pages for i in range(batch)]
        codes = s.batch_get_into([keys[i] for i in idx], addrs, [PAGE_NBYTES] * batch)
        nbytes += sum(c for c in codes if c > 0)
        n += 1
    print(nbytes / (time.perf_counter() - t0) / 1e9, flush=True)
    s.close()


def spawn_child(args: list[str], script: str = __file__) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, script, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline().strip()  # deadline: the child prints within seconds or dies
    if line != "ready":
        proc.kill()
        raise RuntimeError(f"child {args} failed to start: {line!r}")
    return proc


def stop_child(proc: subprocess.Popen) -> None:
    try:
        proc.stdin.close()
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--busy-loop", type=float)
    p.add_argument("--hold-segment", nargs=3)
    p.add_argument("--raw-loader", nargs=5)
    args = p.parse_args(argv)
    if args.busy_loop is not None:
        busy_loop_process(args.busy_loop)
    elif args.hold_segment:
        hold_segment_process(args.hold_segment[0], args.hold_segment[1], int(args.hold_segment[2]))
    elif args.raw_loader:
        m, meta, secs, pages, batch = args.raw_loader
        raw_loader_process(m, meta, float(secs), int(pages), int(batch))
    else:
        p.error("one of --busy-loop, --hold-segment, --raw-loader")
    return 0


if __name__ == "__main__":
    sys.exit(main())
