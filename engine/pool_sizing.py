"""How many KV pages a worker's pool gets: a fixed `num_pages`, or `auto` (0) = what the GPU holds.

    auto:  budget = min(total x gpu_memory_utilization - what this process holds (weights...),
                        free now) - peak activations of the largest forward - a safety margin
           num_pages = budget // page_nbytes

`total`, `free` and what the process holds come from the CUDA driver and torch's allocator after the
weights are loaded; the activation peak from one profiling forward of the largest batch the worker
runs (`profile_activation_bytes`). The arithmetic (`pages_for_memory`) is pure and unit-tested.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.page_allocator import pages_for

MARGIN_BYTES = 512 << 20  # NOTE: the CUDA context, cuBLAS workspaces and allocator fragmentation


class PoolSizeError(ValueError):
    """num_pages auto cannot give the worker a pool (no GPU, or too little memory left)."""


@dataclass(frozen=True)
class PoolSize:
    num_pages: int
    page_nbytes: int
    page_size: int
    how: str  # "fixed" or the auto arithmetic, for the start-up line

    @property
    def tokens(self) -> int:
        return self.num_pages * self.page_size

    @property
    def nbytes(self) -> int:
        return self.num_pages * self.page_nbytes

    def describe(self) -> str:
        return (f"KV pool: {self.num_pages} pages x {self.page_size} tokens = {self.tokens} tokens of KV capacity "
                f"({self.nbytes / 2**30:.2f} GiB, {self.how})")


def pages_for_memory(total: int, free: int, held: int, activation: int, utilization: float, page_nbytes: int,
                     margin: int = MARGIN_BYTES) -> int:
    """Pages that fit in this worker's share of the device (bytes in, pages out; never negative)."""
    budget = min(int(total * utilization) - held, free) - activation - margin
    return max(0, budget // page_nbytes)


def size_pool(requested: int, page_nbytes: int, page_size: int, device: str, utilization: float,
              profile_activation: Callable[[], int], key: str = "num_pages") -> PoolSize:
    if requested > 0:
        return PoolSize(requested, page_nbytes, page_size, "fixed")
    if not device.startswith("cuda"):
        raise PoolSizeError(f"{key}: auto sizes the pool from GPU memory, but model.device is {device!r}; "
                            f"set {key} to a number of pages")
    import torch

    dev = torch.device(device)
    activation = profile_activation()
    torch.cuda.synchronize(dev)
    free, total = torch.cuda.mem_get_info(dev)
    held = torch.cuda.memory_reserved(dev)
    pages = pages_for_memory(total, free, held, activation, utilization, page_nbytes)
    how = (f"auto: {utilization:g} x {total / 2**30:.1f} GiB, {held / 2**30:.2f} GiB held by weights, "
           f"{activation / 2**30:.2f} GiB activation peak, {free / 2**30:.1f} GiB free")
    if pages < 2:
        raise PoolSizeError(f"{key}: auto leaves room for {pages} KV pages ({how}); raise "
                            "model.gpu_memory_utilization, lower the batch sizes, or use a GPU with more memory")
    return PoolSize(pages, page_nbytes, page_size, how)


def profile_activation_bytes(model, arch, page_size: int, kv_dtype, max_tokens: int, attention: str) -> int:
    """Peak bytes one forward of `max_tokens` prompt tokens allocates beyond what is held now (CUDA).

    A throwaway pool holds just that prompt; its own bytes are not counted (the real pool replaces it).
    """
    import torch

    from engine.kv_pool import KVPool
    from engine.model_runner import Chunk, ModelRunner

    dev = model.device
    pages = pages_for(max_tokens, page_size)
    pool = KVPool(arch, pages, page_size, kv_dtype, dev)
    runner = ModelRunner(model, arch, pool, attention)
    torch.cuda.synchronize(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    before = torch.cuda.memory_allocated(dev)
    runner.forward([Chunk(list(range(pages)), 0, [0] * max_tokens)])
    torch.cuda.synchronize(dev)
    peak = torch.cuda.max_memory_allocated(dev) - before
    del runner, pool
    torch.cuda.empty_cache()
    return peak
