"""CPU decode attention of one layer, per backend candidate, on SmolLM2-135M's shapes (30 layers, 9 query
/ 3 KV heads of 64, page 16): what docs/workers.md's choice of backend rests on.

    reference   the torch backend: index_select every page out of the pool, SDPA with a mask
    in_place    gather-and-reduce in torch compiled by inductor: reads each page in place (no copy)
    flex        FlexAttention (compiled) with a length mask: needs K/V as dense [B, Hkv, L, D], so the
                same copy as the reference first (the page-first pool is not that layout)
    copy only   the reference's index_select alone

Candidates run interleaved (each call finds the caches as the others left them, as layer after layer
does), each call timed, medians of --reps; compile times are reported apart. Run back to back on
one layer instead, the in-place kernel looks 3x faster than the reference: its K/V stays in cache.

    python bench/attention_cpu.py [--batch 32] [--context 160] [--reps 30] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F

from engine.attention.torch_ref import gather_pages

LAYERS, HKV, G, D, P = 30, 3, 3, 64, 16


def decode_math(q: torch.Tensor, kv: torch.Tensor, table: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """q [B, Hq, D], kv = one layer of the pool [pages, 2, Hkv, P, D], table [B, M], lens [B] -> [B, Hq * D].

    NOTE: indexed by whole pages (P x D contiguous values each), which inductor vectorises; indexed
    token by token it ran ~8x slower still.
    """
    B, M = table.shape
    H, P, D = kv.shape[2], kv.shape[3], kv.shape[4]
    G = q.shape[1] // H
    k = kv[:, 0][table].to(q.dtype)                                      # [B, M, H, P, D], fused: not materialised
    v = kv[:, 1][table].to(q.dtype)
    s = (q.view(B, 1, H, G, 1, D) * k[:, :, :, None]).sum(-1) * D ** -0.5  # [B, M, H, G, P]
    pos = torch.arange(M, device=q.device)[:, None] * P + torch.arange(P, device=q.device)[None, :]
    s = s.masked_fill((pos[None] >= lens.view(B, 1, 1))[:, :, None, None, :], float("-inf"))
    p = torch.softmax(s.permute(0, 2, 3, 1, 4).reshape(B, H, G, M * P), dim=-1).view(B, H, G, M, P)
    return (p.permute(0, 3, 1, 2, 4)[..., None] * v[:, :, :, None]).sum((1, 4)).reshape(B, H * G * D)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--context", type=int, default=160)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-flex", action="store_true", help="skip FlexAttention (its CPU compile takes ~1 min)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    B, M = args.batch, -(-args.context // P)
    pool = torch.randn(B * M + 8, LAYERS, 2, HKV, P, D)
    table = torch.randperm(B * M + 8)[:B * M].view(B, M)
    lens = torch.full((B,), args.context)
    q = torch.randn(B, HKV * G, D)
    layer = 3
    lv = pool[:, layer]
    t = torch.arange(M * P)
    mask = (t[None] < lens[:, None])[:, None, None]

    def reference():
        kk, vv = gather_pages(lv, table).transpose(1, 2)
        return F.scaled_dot_product_attention(q[:, :, None], kk, vv, attn_mask=mask, enable_gqa=True).reshape(B, -1)

    compiled = torch.compile(decode_math, dynamic=True, fullgraph=True)

    def paged():
        return compiled(q, lv, table, lens)

    cands = {"reference": reference, "in_place": paged, "copy_only": lambda: gather_pages(lv, table)}
    compile_s = {}
    t0 = time.perf_counter()
    want = reference()
    got = paged()
    compile_s["in_place"] = time.perf_counter() - t0
    if not args.no_flex:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        block_mask = create_block_mask(lambda b, h, qi, ki: ki < lens[b], B, None, 1, M * P, device="cpu")
        flex_c = torch.compile(flex_attention)

        def flex():
            kk, vv = gather_pages(lv, table).transpose(1, 2)
            return flex_c(q[:, :, None], kk.contiguous(), vv.contiguous(), block_mask=block_mask,
                          enable_gqa=True).reshape(B, -1)

        t0 = time.perf_counter()
        flex_out = flex()
        compile_s["flex"] = time.perf_counter() - t0
        assert torch.allclose(flex_out, want, atol=1e-5)
        cands["flex"] = flex
    assert torch.allclose(got, want, atol=1e-5)
    times: dict[str, list[float]] = {k: [] for k in cands}
    for _ in range(args.reps):
        for name, fn in cands.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    res = {f"{k}_ms": v * 1e3 for k, v in med.items()}
    res.update({f"{k}_compile_s": v for k, v in compile_s.items()},
               in_place_over_reference_ratio=med["reference"] / med["in_place"], batch=B, context_tokens=args.context)
    for k, v in med.items():
        print(f"{k:>10} {v * 1e3:8.3f} ms   ({med['reference'] / v:.2f}x the reference's speed)")
    if args.json:
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in res.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
