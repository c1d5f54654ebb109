"""The paged Triton kernels and the fused kernels against references (attention in float64 over the same pages,
the torch ops they replace); run by bench/gpu_check/run.py (part 1) and tests/unit/test_triton_kernels.py.

    grid      paged_decode (19 shapes) and paged_extend (17): pages of 16 and 64 tokens, 1 / 4 / 7 / 8
              query heads per KV head, head_dim 64 and 128, ragged lengths at and one past page
              boundaries, 1 to 64 splits; fp32 (ieee dot products) and bf16 (q and the pool in bf16,
              fp32 accumulation). Each case: the worst error relative to the reference's largest |value|;
              in bf16 also torch's own SDPA in bf16 on the same K/V, so the tolerance is not a guess
              about bf16 rounding: ours passes within BF16_TOLERANCE or within 2x torch's error.
    fused     engine/fused_kernels.py's add + RMSNorm, SwiGLU and RoPE against the torch ops they replace

On a CPU (gpu_check --smoke, and tests/unit/test_triton_kernels.py) the same functions run in Triton's
interpreter (TRITON_INTERPRET=1, in a child process), fp32 only: the interpreter's bf16 tl.dot is wrong.
"""

from __future__ import annotations

import torch

FP32_TOLERANCE = 1e-5
BF16_TOLERANCE = 2e-2
PAGES = (16, 64)
GROUPS = (1, 4, 7, 8)  # query heads per KV head
HEAD_DIMS = (64, 128)
SPLITS = (1, 4, 16, 64, 2, 8, 32, 64)


class PoolArch:
    """The pool's geometry only (KVPool reads nothing else)."""

    def __init__(self, layers: int, kv_heads: int, heads: int, head_dim: int):
        self.num_layers, self.num_kv_heads, self.num_heads, self.head_dim = layers, kv_heads, heads, head_dim
        self.kv_values_per_token = layers * 2 * kv_heads * head_dim


def decode_grid(smoke: bool = False) -> list[dict]:
    """19 shapes: every (page, group, head_dim) with 2 KV heads, then 3 long contexts with many splits."""
    cases = []
    for i, (p, g, d) in enumerate((p, g, d) for p in PAGES for g in GROUPS for d in HEAD_DIMS):
        lens = [1, p, p + 1, 3 * p - 1, 5 * p + 1]
        cases.append({"page": p, "heads": 2 * g, "kv_heads": 2, "head_dim": d, "splits": SPLITS[i % 8], "lens": lens})
    cases += [{"page": 64, "heads": 32, "kv_heads": 8, "head_dim": 128, "splits": s, "lens": [4096, 4097, 1, 2000]}
              for s in (16, 32, 64)]
    if smoke:  # the interpreter runs a program at a time: short sequences, few heads
        return [{**c, "lens": [1, c["page"], c["page"] + 1]} for c in cases[:16:5]]
    return cases


def extend_grid(smoke: bool = False) -> list[dict]:
    """17 shapes: every (page, group, head_dim) with a chunk on a ragged cached prefix, and one token."""
    cases = []
    spans = (lambda p: (0, 2 * p + 1), lambda p: (p, 3 * p), lambda p: (p + 1, 4 * p + 1), lambda p: (3 * p - 1, 3 * p))
    for i, (p, g, d) in enumerate((p, g, d) for p in PAGES for g in GROUPS for d in HEAD_DIMS):
        start, end = spans[i % 4](p)
        cases.append({"page": p, "heads": 2 * g, "kv_heads": 2, "head_dim": d, "start": start, "end": end})
    cases.append({"page": 16, "heads": 32, "kv_heads": 8, "head_dim": 128, "start": 1000, "end": 1001})
    if smoke:
        return [{**c, "start": c["page"] - 1, "end": c["page"] + 1} for c in cases[:16:5]]
    return cases


def attention64(q, pool, layer, pages, start, end):
    """float64 causal attention of q [n, Hq, D] (positions start..end-1) over positions 0..end-1."""
    P, H = pool.page_size, pool.arch.num_kv_heads
    G = q.shape[1] // H
    t = torch.arange(end, device=q.device)
    kv = pool.layer_view(layer)[torch.as_tensor(pages, device=q.device)[t // P], :, :, t % P].double()  # [end, 2, H, D]
    k, v = kv[:, 0].repeat_interleave(G, 1), kv[:, 1].repeat_interleave(G, 1)                       # [end, Hq, D]
    s = torch.einsum("nhd,thd->hnt", q.double(), k) / q.shape[-1] ** 0.5
    s = s.masked_fill(t[None, None, :] > torch.arange(start, end, device=q.device)[None, :, None], float("-inf"))
    return torch.einsum("hnt,thd->nhd", torch.softmax(s, -1), v)


def sdpa_in(q, pool, layer, pages, start, end):
    """torch's SDPA in q's dtype over the same K/V: what bf16 rounding costs a library kernel."""
    P, G = pool.page_size, q.shape[1] // pool.arch.num_kv_heads
    t = torch.arange(end, device=q.device)
    kv = pool.layer_view(layer)[torch.as_tensor(pages, device=q.device)[t // P], :, :, t % P].to(q.dtype)
    k, v = (x.repeat_interleave(G, 1).transpose(0, 1)[None] for x in (kv[:, 0], kv[:, 1]))
    mask = t[None, :] <= torch.arange(start, end, device=q.device)[:, None]
    return torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1)[None], k, v, attn_mask=mask)[0].transpose(0, 1)


def case_pool(case, pages: int, dtype, device):
    from engine.kv_pool import KVPool

    pool = KVPool(PoolArch(2, case["kv_heads"], case["heads"], case["head_dim"]), pages, case["page"], dtype, device)
    pool.tensor.normal_()
    return pool


def _relative(out, ref) -> float:
    return float((out.double() - ref).abs().max() / ref.abs().max())


def decode_errors(case: dict, dtype, device, block_n: int = 64) -> tuple[float, float | None]:
    """(ours, torch SDPA in bf16 or None in fp32): worst relative error over the case's sequences."""
    from engine.attention import triton_kernels as tk

    torch.manual_seed(case["page"] * 131 + case["heads"])
    P, lens = case["page"], case["lens"]
    total = sum(-(-n // P) for n in lens)
    pool = case_pool(case, total + 3, dtype, device)
    perm, tables, used = torch.randperm(total + 3).tolist(), [], 0
    for n in lens:
        k = -(-n // P)
        tables.append(perm[used:used + k])
        used += k
    width = max(map(len, tables))
    table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device=device)
    q = torch.randn(len(lens), case["heads"], case["head_dim"], device=device).to(dtype)
    out = tk.paged_decode(q, pool, 1, table, torch.tensor(lens, dtype=torch.int32, device=device), case["splits"],
                          block_n)
    ours, theirs = 0.0, None if dtype == torch.float32 else 0.0
    for i, n in enumerate(lens):
        ref = attention64(q[i:i + 1], pool, 1, tables[i], n - 1, n)
        ours = max(ours, _relative(out[i].reshape(ref.shape), ref))
        if theirs is not None:
            theirs = max(theirs, _relative(sdpa_in(q[i:i + 1], pool, 1, tables[i], n - 1, n), ref))
    return ours, theirs


def extend_errors(case: dict, dtype, device, block_m: int = 64, block_n: int = 64) -> tuple[float, float | None]:
    from engine.attention import triton_kernels as tk

    torch.manual_seed(case["end"] * 7 + case["heads"])
    start, end, P = case["start"], case["end"], case["page"]
    pages = -(-end // P)
    pool = case_pool(case, pages + 3, dtype, device)
    table = torch.randperm(pages + 3)[:pages].to(device)
    q = torch.randn(end - start, case["heads"], case["head_dim"], device=device).to(dtype)
    out = tk.paged_extend(q, pool, 1, table.to(torch.int32), start, end, block_m=block_m, block_n=block_n)
    ref = attention64(q, pool, 1, table, start, end)
    theirs = None if dtype == torch.float32 else _relative(sdpa_in(q, pool, 1, table, start, end), ref)
    return _relative(out, ref), theirs


def passes(ours: float, theirs: float | None) -> bool:
    if theirs is None:
        return ours <= FP32_TOLERANCE
    return ours <= max(BF16_TOLERANCE, 2 * theirs)


def run_kernels(device: str, dtypes=("float32", "bfloat16"), smoke: bool = False) -> list[dict]:
    """One entry per (kernel, shape, dtype); an entry that raised carries its error, not a number."""
    out = []
    small = {"block_n": 16} if smoke else {}
    for name in dtypes:
        dtype = getattr(torch, name)
        for kernel, grid, fn in (("paged_decode", decode_grid(smoke), decode_errors),
                                 ("paged_extend", extend_grid(smoke), extend_errors)):
            for case in grid:
                entry = {"kernel": kernel, "dtype": name, **case}
                try:
                    kw = small if kernel == "paged_decode" else ({"block_m": 16, **small} if smoke else {})
                    ours, theirs = fn(case, dtype, device, **kw)
                    entry.update(rel_err=ours, torch_rel_err=theirs, ok=passes(ours, theirs))
                except Exception as e:  # noqa: BLE001 - reported per case; the grid goes on
                    entry.update(error=f"{type(e).__name__}: {e}"[:500], ok=False)
                out.append(entry)
    return out


def rotary_store_errors(dtype, pool_dtype, device="cpu", tokens=6, hq=4, hkv=2, d=32) -> float:
    """rotary_store, TritonOps against TorchOps: the rotated q and k, and the pool after the write
    (k and v at scattered rows of one layer, cast to the pool's dtype; every other row untouched)."""
    from engine.fused_ops import TorchOps, TritonOps

    qkv = torch.randn(tokens, (hq + 2 * hkv) * d, device=device).to(dtype)
    q, k, v = (qkv[:, a:b].view(tokens, -1, d) for a, b in ((0, hq * d), (hq * d, (hq + hkv) * d),
                                                             ((hq + hkv) * d, (hq + 2 * hkv) * d)))
    ang = torch.randn(tokens, 1, d, device=device)
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    rows = torch.randperm(4 * tokens * 2 * hkv, device=device)[:tokens * 2 * hkv].view(tokens, 2, hkv)
    pools = [torch.full((8 * tokens * 2 * hkv, d), 7.0, device=device, dtype=pool_dtype) for _ in range(2)]
    ours = TritonOps.rotary_store(q, k, v, cos, sin, pools[0], rows, 3 * tokens * 2 * hkv)
    ref = TorchOps.rotary_store(q, k, v, cos, sin, pools[1], rows, 3 * tokens * 2 * hkv)
    return _pair_error((*ours, pools[0]), (*ref, pools[1]))


def _pair_error(ours, ref) -> float:
    return max(_relative(a, b.double()) for a, b in zip(ours, ref))


def _fused_error(op: str, dtype, device) -> float:
    """One fused kernel against its torch ops on Llama-3.1-8B's widths (33 tokens)."""
    from engine.fused_ops import TorchOps, TritonOps

    torch.manual_seed(5)
    if op == "add_rms_norm":
        x, delta = (torch.randn(33, 4096, device=device).to(dtype) for _ in range(2))
        w = torch.randn(4096, device=device).to(dtype)
        return _pair_error(TritonOps.add_rms_norm(x, delta, w, 1e-5), TorchOps.add_rms_norm(x, delta, w, 1e-5))
    if op == "silu_mul":
        gate_up = (torch.randn(33, 2 * 14336, device=device) * 4).to(dtype)
        return _pair_error((TritonOps.silu_mul(gate_up, 14336),), (TorchOps.silu_mul(gate_up, 14336),))
    return rotary_store_errors(dtype, dtype, device, tokens=33, hq=32, hkv=8, d=128)  # the pool in the model's dtype


def run_fused(device: str, dtypes=("float32", "bfloat16")) -> list[dict]:
    """engine/fused_kernels.py (TritonOps) against TorchOps, per dtype: the largest difference relative to
    the largest |value| (bf16: a rounding apart is 2^-8 of a value)."""
    out = []
    for name in dtypes:
        tol = FP32_TOLERANCE if name == "float32" else BF16_TOLERANCE
        for op in ("add_rms_norm", "silu_mul", "rotary_store"):
            try:  # NOTE: an op that raises is reported as failed; the others still run
                err = _fused_error(op, getattr(torch, name), device)
                out.append({"op": op, "dtype": name, "rel_err": err, "ok": err <= tol})
            except Exception as e:  # noqa: BLE001
                out.append({"op": op, "dtype": name, "error": f"{type(e).__name__}: {e}"[:500], "ok": False})
    return out
