"""Store I/O per KV-head group: what storing a page as G objects (one per group of KV heads) costs.

A worker of any TP size reads exactly its KV heads when a page is stored as objects per head group
(issue: tensor parallelism, "a store layout independent of TP"). In the pool's page-first layout
[layer, K|V, kv_head, slot, head_dim] a group's heads are contiguous within each (layer, K|V), so
one group object is 2 x layers slices of the page, written and read in place with Mooncake's
multi-buffer calls (no staging copy). Measured here, in one run against one pure client per
group count, objects in another process's segment (TCP loopback), on an 8-KV-head page:

    G = 1        batch_put_from / batch_get_into, one contiguous object per page (today's layout)
    G > 1        batch_put_from_multi_buffers / batch_get_into_multi_buffers, G objects per page,
                 each of 2 x layers slices in place
    G contiguous the control: G contiguous chunks per page (a group-major page layout would give
                 that), batch_put_from / batch_get_into

Reported per G: load and write GB/s (medians of --runs), their ratio to G = 1, and the objects'
size; and what a staging copy to a group-major page costs, in GB/s. Every load is checked against
the written bytes.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

LAYERS, KV_HEADS, SLOTS, HEAD_DIM, ELT = 16, 8, 16, 64, 4  # an 8-KV-head model, fp32, 16-token pages
PAGE_NBYTES = LAYERS * 2 * KV_HEADS * SLOTS * HEAD_DIM * ELT  # 1 MiB
HEAD_NBYTES = SLOTS * HEAD_DIM * ELT


def group_slices(page_addr: int, group: int, groups: int) -> tuple[list[int], list[int]]:
    """(addresses, sizes) of the 2 x LAYERS slices holding `group`'s KV heads in one page."""
    per = KV_HEADS // groups
    size = per * HEAD_NBYTES
    addrs = [page_addr + ((layer * 2 + kv) * KV_HEADS + group * per) * HEAD_NBYTES
             for layer in range(LAYERS) for kv in range(2)]
    return addrs, [size] * len(addrs)


class HeadGroupBench:
    def __init__(self, raw, pages: int, batch: int, seconds: float):
        self.raw, self.pages, self.batch, self.seconds = raw, pages, batch, seconds
        self.src = np.random.default_rng(1).integers(0, 256, size=(pages, PAGE_NBYTES), dtype=np.uint8)
        self.dst = np.zeros_like(self.src)
        for buf in (self.src, self.dst):
            raw.register_buffer(buf.ctypes.data, buf.nbytes)

    def _objects(self, arr: np.ndarray, idx, groups: int, prefix: str):
        keys, ptrs, sizes = [], [], []
        for i in idx:
            for g in range(groups):
                a, s = group_slices(arr.ctypes.data + i * PAGE_NBYTES, g, groups)
                keys.append(f"{prefix}/{i}/g{g}")
                ptrs.append(a)
                sizes.append(s)
        return keys, ptrs, sizes

    @staticmethod
    def _chunks(arr: np.ndarray, idx, groups: int, prefix: str):
        """A group-major page: each group one contiguous PAGE_NBYTES / groups chunk (the control)."""
        size = PAGE_NBYTES // groups
        keys = [f"{prefix}/{i}/g{g}" for i in idx for g in range(groups)]
        addrs = [arr.ctypes.data + i * PAGE_NBYTES + g * size for i in idx for g in range(groups)]
        return keys, addrs, [size] * len(keys)

    def write(self, groups: int, prefix: str, contiguous: bool = False) -> float:
        """Writes every page as `groups` objects (of 2 x LAYERS slices, or `contiguous` chunks); GB/s."""
        t0 = time.perf_counter()
        for lo in range(0, self.pages, self.batch):
            idx = range(lo, min(lo + self.batch, self.pages))
            if groups == 1 or contiguous:
                codes = self.raw.batch_put_from(*self._chunks(self.src, idx, groups, prefix))
            else:
                keys, ptrs, sizes = self._objects(self.src, idx, groups, prefix)
                codes = self.raw.batch_put_from_multi_buffers(keys, ptrs, sizes)
            if any(c != 0 for c in codes):
                raise RuntimeError(f"G={groups}: writing failed: {sorted(set(codes))}")
        return self.pages * PAGE_NBYTES / (time.perf_counter() - t0) / 1e9

    def load(self, groups: int, prefix: str, contiguous: bool = False) -> float:
        """Loads batches of pages (each as `groups` objects) for --seconds; GB/s."""
        self.dst[:] = 0
        nbytes, n, t0 = 0, 0, time.perf_counter()
        starts = list(range(0, self.pages, self.batch))
        want = PAGE_NBYTES // groups
        while time.perf_counter() - t0 < self.seconds or n < len(starts):
            lo = starts[n % len(starts)]
            idx = range(lo, min(lo + self.batch, self.pages))
            if groups == 1 or contiguous:
                codes = self.raw.batch_get_into(*self._chunks(self.dst, idx, groups, prefix))
            else:
                keys, ptrs, sizes = self._objects(self.dst, idx, groups, prefix)
                codes = self.raw.batch_get_into_multi_buffers(keys, ptrs, sizes)
            if any(c != want for c in codes):
                raise RuntimeError(f"G={groups}: loading failed: {sorted(set(codes))}")
            nbytes += PAGE_NBYTES * len(idx)
            n += 1
        gbps = nbytes / (time.perf_counter() - t0) / 1e9
        if not np.array_equal(self.dst, self.src):
            raise RuntimeError(f"G={groups}: loaded bytes differ from the written pages")
        return gbps


def staging_gbps(groups: int, pages: int, seconds: float) -> float:
    """The copy a group-major staging buffer would add per page: the pool's page permuted to
    [group, layer, K|V, heads of the group, slot, dim], in GB/s (one core)."""
    src = np.random.default_rng(2).integers(0, 256, size=(pages, LAYERS, 2, groups, PAGE_NBYTES // (LAYERS * 2 * groups)),
                                            dtype=np.uint8)
    dst = np.empty((pages, groups, LAYERS, 2, src.shape[-1]), dtype=np.uint8)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds or n == 0:
        np.copyto(dst, src.transpose(0, 3, 1, 2, 4))
        n += 1
    return n * src.nbytes / (time.perf_counter() - t0) / 1e9


def run_head_groups(master, groups: list[int], pages: int, batch: int, seconds: float, runs: int) -> dict:
    from mooncake.store import MooncakeDistributedStore

    raw = MooncakeDistributedStore()
    if raw.setup("127.0.0.1", master.metadata_url, 0, 16 << 20, "tcp", "", master.master_address):
        raise RuntimeError("raw client setup failed")
    try:
        bench = HeadGroupBench(raw, pages, batch, seconds)
        cases = [(g, False) for g in groups] + [(g, True) for g in groups if g > 1]
        loads: dict[tuple, list[float]] = {c: [] for c in cases}
        writes: dict[tuple, list[float]] = {c: [] for c in cases}
        for r in range(runs):
            for g, contiguous in cases:  # interleaved: machine noise hits every case alike
                prefix = f"bench-head-groups/{r}/G{g}{'c' if contiguous else ''}"
                writes[g, contiguous].append(bench.write(g, prefix, contiguous))
                loads[g, contiguous].append(bench.load(g, prefix, contiguous))
                raw.remove_by_regex(f"^{prefix}/")
    finally:
        raw.close()
    med = {c: (statistics.median(loads[c]), statistics.median(writes[c])) for c in cases}
    base_load, base_write = med[groups[0], False]
    staging = {str(g): staging_gbps(g, pages, seconds) for g in groups if g > 1}
    return {"head_group_staging_gbps": staging, "head_groups": {f"{g}{' contiguous' if c else ''}": {
                "object_nbytes": PAGE_NBYTES // g, "slices": 1 if (c or g == 1) else 2 * LAYERS,
                "load_gbps": med[g, c][0], "write_gbps": med[g, c][1],
                "load_ratio": med[g, c][0] / base_load, "write_ratio": med[g, c][1] / base_write} for g, c in cases},
            "head_group_page_nbytes": PAGE_NBYTES, "head_group_pages": pages}


def head_group_rows(res: dict) -> list[tuple[str, str, str]]:
    rows = [(f"(8) head groups, {res['head_group_page_nbytes'] >> 10} KiB pages of {KV_HEADS} KV heads", "", "")]
    for name, row in res["head_groups"].items():
        rows.append((f"    G = {name} ({row['object_nbytes'] >> 10} KiB objects of {row['slices']} slices) load / write",
                     f"{row['load_gbps']:.2f} / {row['write_gbps']:.2f} GB/s",
                     f"x{row['load_ratio']:.2f} / x{row['write_ratio']:.2f} of G = 1"))
    for g, gbps in res.get("head_group_staging_gbps", {}).items():
        rows.append((f"    G = {g}: the page permuted to group-major (a staging copy)", f"{gbps:.2f} GB/s", "one core"))
    return rows
