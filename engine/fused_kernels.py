"""Triton kernels of engine/fused_ops.py's TritonOps: one program per token row.

    add_rms_norm   s = x + delta (input dtype), y = (s_fp32 * rsqrt(mean(s_fp32^2) + eps)) cast, times weight
    silu_mul       y = silu(gate_fp32) cast, times up (input dtype)
    rotary_store   RoPE of q and k, and the new K (rotated) and V written into the KV pool, in one launch
                   (one program per token and head of q, k and v), HF's half split

NOTE: rows of up to BLOCK = next power of two of the hidden size (or a block of the ffn width) per
program: the hidden sizes served (<= 16k) fit one block. Tested against TorchOps in Triton's
interpreter on CPU (tests/unit/test_triton_kernels.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add_rms_norm_kernel(X, DELTA, W, Y, S, stride_x, stride_d, stride_y, stride_s, n, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # NOTE: row x stride passes 2^31 in long prefills
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0)
    d = tl.load(DELTA + row * stride_d + cols, mask=mask, other=0.0)
    s = (x.to(tl.float32) + d.to(tl.float32)).to(x.dtype)  # rounded to the input dtype, as torch's add
    tl.store(S + row * stride_s + cols, s, mask=mask)
    sf = s.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(sf * sf, axis=0) / n + eps)
    w = tl.load(W + cols, mask=mask, other=0.0)
    y = w.to(tl.float32) * (sf * rstd).to(x.dtype).to(tl.float32)
    tl.store(Y + row * stride_y + cols, y.to(x.dtype), mask=mask)


@triton.jit
def _silu_mul_kernel(GU, Y, stride_gu, stride_y, ffn, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # NOTE: row x stride passes 2^31 from ~75k tokens at ffn 14336
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < ffn
    g = tl.load(GU + row * stride_gu + cols, mask=mask, other=0.0)
    u = tl.load(GU + row * stride_gu + ffn + cols, mask=mask, other=0.0)
    gf = g.to(tl.float32)
    act = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)  # F.silu: fp32 inside, rounded to the input dtype
    tl.store(Y + row * stride_y + cols, (act.to(tl.float32) * u.to(tl.float32)).to(g.dtype), mask=mask)


@triton.jit
def _rotate(src, COS, SIN, t, stride_c, HALF: tl.constexpr, BLOCK: tl.constexpr):
    """RoPE of one head's row at src: x * cos + cat(-x2, x1) * sin, each product rounded to the input
    dtype, then the sum (as torch's apply_rotary). Returns the two halves."""
    i = tl.arange(0, BLOCK)
    m = i < HALF
    x1 = tl.load(src + i, mask=m, other=0.0)
    x2 = tl.load(src + HALF + i, mask=m, other=0.0)
    c1 = tl.load(COS + t * stride_c + i, mask=m, other=0.0)
    c2 = tl.load(COS + t * stride_c + HALF + i, mask=m, other=0.0)
    s1 = tl.load(SIN + t * stride_c + i, mask=m, other=0.0)
    s2 = tl.load(SIN + t * stride_c + HALF + i, mask=m, other=0.0)
    dt = x1.dtype
    a1 = (x1.to(tl.float32) * c1.to(tl.float32)).to(dt).to(tl.float32)
    b1 = (-x2.to(tl.float32) * s1.to(tl.float32)).to(dt).to(tl.float32)
    a2 = (x2.to(tl.float32) * c2.to(tl.float32)).to(dt).to(tl.float32)
    b2 = (x1.to(tl.float32) * s2.to(tl.float32)).to(dt).to(tl.float32)
    return (a1 + b1).to(dt), (a2 + b2).to(dt)


# NOTE: the layer's row offset changes every call: not specialised (one compile for every layer)
@triton.jit(do_not_specialize=["layer_off"])
def _rotary_store_kernel(Q, K, V, COS, SIN, QO, KO, DEST, ROWS, layer_off, stride_q, stride_k, stride_v, stride_c,
                         stride_qo, stride_ko, stride_dest, stride_r0, stride_r1, stride_r2, hq, hkv,
                         HALF: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)  # heads 0..hq-1 of q, then hkv of k, then hkv of v
    i = tl.arange(0, BLOCK)
    m = i < HALF
    if h < hq:
        y1, y2 = _rotate(Q + t * stride_q + h * 2 * HALF, COS, SIN, t, stride_c, HALF, BLOCK)
        _store_halves(QO + t * stride_qo + h * 2 * HALF, y1, y2, HALF, BLOCK)
    elif h < hq + hkv:
        j = h - hq
        y1, y2 = _rotate(K + t * stride_k + j * 2 * HALF, COS, SIN, t, stride_c, HALF, BLOCK)
        _store_halves(KO + t * stride_ko + j * 2 * HALF, y1, y2, HALF, BLOCK)
        row = tl.load(ROWS + t * stride_r0 + j * stride_r2) + layer_off  # K's pool row (kv index 0)
        _store_halves(DEST + row * stride_dest, y1, y2, HALF, BLOCK)
    else:
        j = h - hq - hkv
        row = tl.load(ROWS + t * stride_r0 + stride_r1 + j * stride_r2) + layer_off  # V's pool row (kv index 1)
        x1 = tl.load(V + t * stride_v + j * 2 * HALF + i, mask=m, other=0.0)
        x2 = tl.load(V + t * stride_v + j * 2 * HALF + HALF + i, mask=m, other=0.0)
        _store_halves(DEST + row * stride_dest, x1, x2, HALF, BLOCK)


@triton.jit
def _store_halves(dst, y1, y2, HALF: tl.constexpr, BLOCK: tl.constexpr):
    """One head's row at dst from its two halves, cast to dst's dtype."""
    i = tl.arange(0, BLOCK)
    m = i < HALF
    tl.store(dst + i, y1.to(dst.dtype.element_ty), mask=m)
    tl.store(dst + HALF + i, y2.to(dst.dtype.element_ty), mask=m)


def rotary_store(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 dest: torch.Tensor, rows: torch.Tensor, layer_off: int):
    """RoPE of q [T, Hq, D] and k [T, Hkv, D], and k (rotated) and v [T, Hkv, D] written into the pool's
    rows `dest` [N, D] at rows[t, 0 | 1, head] + layer_off, cast to the pool's dtype: one launch.
    Heads contiguous in a token's row; cos / sin [T, 1, D]; rows [T, 2, Hkv] (int64). Returns (q, k) rotated."""
    t, hq, d = q.shape
    hkv = k.shape[1]
    if d % 2 or any(x.stride(2) != 1 or x.stride(1) != d for x in (q, k, v)) or dest.stride(1) != 1:
        raise ValueError(f"rotary_store: heads must be contiguous in a token's row (q strides {q.stride()}, "
                         f"k {k.stride()}, v {v.stride()}, dest {dest.stride()})")
    qo, ko = torch.empty(t, hq, d, dtype=q.dtype, device=q.device), torch.empty_like(k, memory_format=torch.contiguous_format)
    if t:
        cos, sin = cos.reshape(t, d).contiguous(), sin.reshape(t, d).contiguous()
        _rotary_store_kernel[(t, hq + 2 * hkv)](
            q, k, v, cos, sin, qo, ko, dest, rows, layer_off, q.stride(0), k.stride(0), v.stride(0), cos.stride(0),
            qo.stride(0), ko.stride(0), dest.stride(0), *rows.stride(), hq, hkv, HALF=d // 2,
            BLOCK=triton.next_power_of_2(d // 2))
    return qo, ko


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float):
    """(rms_norm(x + delta) * weight, x + delta) for x, delta [T, h] (rows contiguous in the last dim)."""
    t, n = x.shape
    y, s = torch.empty_like(x), torch.empty_like(x)
    if t:
        _add_rms_norm_kernel[(t,)](x, delta, weight, y, s, x.stride(0), delta.stride(0), y.stride(0), s.stride(0),
                                   n, eps, BLOCK=triton.next_power_of_2(n))
    return y, s


def silu_mul(gate_up: torch.Tensor, ffn: int, block: int = 1024) -> torch.Tensor:
    """silu(gate_up[:, :ffn]) * gate_up[:, ffn:] -> [T, ffn]."""
    t = gate_up.shape[0]
    y = torch.empty(t, ffn, dtype=gate_up.dtype, device=gate_up.device)
    if t:
        block = min(block, triton.next_power_of_2(ffn))
        _silu_mul_kernel[(t, triton.cdiv(ffn, block))](gate_up, y, gate_up.stride(0), y.stride(0), ffn, BLOCK=block)
    return y
