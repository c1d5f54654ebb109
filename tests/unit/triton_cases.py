"""Cases for tests/unit/test_triton_kernels.py, run in a child process started with TRITON_INTERPRET=1
(Triton decides at import whether its kernels are interpreted, so they cannot share a process with
code that imported it compiled). Each case compares a kernel with float64 attention over the pages."""

from __future__ import annotations

import json
import sys
import traceback

import torch
import triton.runtime.interpreter as _interp

from engine.attention import triton_kernels as tk

_patch_lang_tensor = _interp._patch_lang_tensor


def _patch_index(tensor, scope):
    """NOTE: Triton 3.6's interpreter turns a scalar (held as a 1-element array) into a Python int
    with int(array), which NumPy >= 2.3 refuses for arrays of one dimension; this takes the item."""
    _patch_lang_tensor(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))


_interp._patch_lang_tensor = _patch_index
from engine.kv_pool import KVPool


class Arch:  # the pool's geometry only
    def __init__(self, layers, kv_heads, heads, head_dim):
        self.num_layers, self.num_kv_heads, self.num_heads, self.head_dim = layers, kv_heads, heads, head_dim
        self.kv_values_per_token = layers * 2 * kv_heads * head_dim


def attention64(q, pool, layer, table, start, end):
    """float64 causal attention of q [n, Hq, D] (positions start..end-1) over positions 0..end-1."""
    P, H = pool.page_size, pool.arch.num_kv_heads
    G = q.shape[1] // H
    t = torch.arange(end)
    kv = pool.layer_view(layer)[torch.as_tensor(table)[t // P], :, :, t % P].double()   # [end, 2, H, D]
    k, v = kv[:, 0].repeat_interleave(G, 1), kv[:, 1].repeat_interleave(G, 1)      # [end, Hq, D]
    s = torch.einsum("nhd,thd->hnt", q.double(), k) / q.shape[-1] ** 0.5
    s = s.masked_fill(t[None, None, :] > torch.arange(start, end)[None, :, None], float("-inf"))
    return torch.einsum("hnt,thd->nhd", torch.softmax(s, -1), v)


def decode_case(page, heads, kv_heads, head_dim, dtype, splits) -> float:
    """Largest error of paged_decode over 4 sequences of different lengths in scattered pages."""
    torch.manual_seed(page)
    pool = KVPool(Arch(2, kv_heads, heads, head_dim), 40, page, dtype)
    pool.tensor.normal_()
    lens = [1, 7, 33, 70]
    perm = torch.randperm(40).tolist()
    tables, used = [], 0
    for n in lens:
        k = -(-n // page)
        tables.append(perm[used:used + k])
        used += k
    width = max(map(len, tables))
    table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    # NOTE: q stays fp32: the interpreter's tl.dot on bf16 operands is wrong (NumPy has no bf16), so
    # the bf16 case here is a bf16 pool read into fp32 math; bf16 x bf16 runs in bench/gpu_check.py.
    q = torch.randn(len(lens), heads, head_dim)
    out = tk.paged_decode(q, pool, 1, table, torch.tensor(lens, dtype=torch.int32), splits, block_n=16)
    assert out.shape == (len(lens), heads * head_dim) and out.dtype == q.dtype
    return max(float((out[i].double() - attention64(q[i:i + 1].float(), pool, 1, tables[i], n - 1, n)
                      .reshape(-1)).abs().max()) for i, n in enumerate(lens))


def extend_case(start, end, page) -> float:
    """Largest error of paged_extend for a chunk at start..end-1 on a cached prefix."""
    torch.manual_seed(end)
    pool = KVPool(Arch(3, 2, 4, 16), 30, page)
    pool.tensor.normal_()
    table = torch.randperm(30)[:-(-end // page)]
    q = torch.randn(end - start, 4, 16)
    out = tk.paged_extend(q, pool, 2, table, start, end, block_m=16, block_n=16)
    return float((out.double() - attention64(q, pool, 2, table.tolist(), start, end)).abs().max())


CASES = {
    "decode_p4_fp32_1split": lambda: decode_case(4, 4, 2, 16, torch.float32, 1),
    "decode_p16_fp32_4splits": lambda: decode_case(16, 6, 2, 32, torch.float32, 4),
    "decode_p8_bf16_pool_mha_d24": lambda: decode_case(8, 3, 3, 24, torch.bfloat16, 2),
    "extend_fresh": lambda: extend_case(0, 21, 4),
    "extend_on_prefix": lambda: extend_case(13, 40, 4),
    "extend_one_token": lambda: extend_case(32, 33, 16),
    "extend_long_prefix": lambda: extend_case(50, 90, 8),
}


def main() -> None:
    out = {}
    for name, case in CASES.items():
        try:
            out[name] = case()
        except Exception:  # noqa: BLE001 - reported to the parent test
            out[name] = traceback.format_exc()
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
