"""bench/gpu_check/run.py, part 1's speed: the decode kernel alone at batch B x 4k tokens on Llama-3.1-8B's
attention shape (32 q heads, 8 KV heads, 128 dims, bf16): K/V bytes read / time, with its split count.
The correctness half of part 1 is engine/reference/kernel_checks.py (shared with the unit tests)."""

from __future__ import annotations

import statistics

import torch

from engine.reference.kernel_checks import case_pool


def decode_bandwidth(device: str, batches=(1, 32, 128), context: int = 4096, reps: int = 20) -> list[dict]:
    """paged_decode alone on one layer of Llama-3.1-8B's attention (bf16, pages of 64): K/V bytes read per
    second at each batch, with the split count the backend would choose. CUDA only."""
    from engine.attention import triton_kernels as tk

    dev = torch.device(device)
    case = {"page": 64, "heads": 32, "kv_heads": 8, "head_dim": 128}
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    out = []
    for b in batches:
        width = -(-context // 64)
        pool = case_pool(case, b * width, torch.bfloat16, dev)
        table = torch.arange(b * width, dtype=torch.int32, device=dev).view(b, width)
        lens = torch.full((b,), context, dtype=torch.int32, device=dev)
        q = torch.randn(b, 32, 128, device=dev, dtype=torch.bfloat16)
        splits = tk.num_splits(b, 8, -(-context // 64), sms)
        for _ in range(3):
            tk.paged_decode(q, pool, 1, table, lens, splits)
        times = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            tk.paged_decode(q, pool, 1, table, lens, splits)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        t = statistics.median(times)
        nbytes = b * context * 8 * 128 * 2 * 2  # K and V, bf16
        out.append({"batch": b, "context": context, "splits": splits, "kernel_s": t, "gbps": nbytes / t / 1e9})
        del pool
    return out

