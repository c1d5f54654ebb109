"""Triton kernels that read K/V in place from the page-first pool through each sequence's page table.

The pool is seen as rows of head_dim values (KVPool.rows); the K row of (page, layer, head, slot)
is page * PAGE_ROWS + layer_off + head * HEAD_ROWS + slot and its V row is V_OFF rows further
(engine/attention/batch.py). Every BLOCK_N tokens a program looks their pages up in the table, so
any page size works and no K/V is copied or padded.

    decode   grid (B, Hkv, S): one program = one sequence, one KV head (its G query heads packed as
             the rows of one tl.dot), one of S splits of that sequence's blocks (flash-decoding);
             the splits are merged by a second kernel (one program per row and query head: the
             splits' outputs weighted by their log-sum-exps). Lengths are read on the device, so
             one launch shape serves every step (CUDA graphs).
    extend   grid (ceil(n / BLOCK_M), Hq): a chunk of n new tokens at positions start..end-1
             attending causally to positions 0..end-1 (the cached prefix and itself).

NOTE: fp32 inputs use ieee dot products (tf32 would cost ~1e-3 relative error); bf16/fp16 inputs
accumulate in fp32. Tested on CPU with TRITON_INTERPRET=1 (tests/unit/test_attention_backends.py).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


@triton.jit
def _block(q, KV, row, tmask, allowed, d, dmask, m_i, l_i, acc, scale, D: tl.constexpr, V_OFF: tl.constexpr,
           IEEE: tl.constexpr):
    """One block of keys into the online softmax: rows of K/V loaded in place, (m, l, acc) updated."""
    kv_mask = tmask[:, None] & dmask[None, :]
    k = tl.load(KV + row[:, None] * D + d[None, :], mask=kv_mask, other=0.0).to(q.dtype)
    if IEEE:
        qk = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        qk = tl.dot(q, tl.trans(k))
    qk = tl.where(allowed, qk * scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that sees no key yet
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(qk - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(KV + (row + V_OFF)[:, None] * D + d[None, :], mask=kv_mask, other=0.0).to(q.dtype)
    if IEEE:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


# NOTE: offsets and lengths change every call: not specialised (one compile, not one per divisibility class)
@triton.jit(do_not_specialize=["layer_off"])
def _decode_split_kernel(Q, KV, Table, Lens, O, LSE, layer_off, stride_qb, stride_qh, stride_tb,
                         scale, NUM_SPLITS: tl.constexpr, G: tl.constexpr, BLOCK_G: tl.constexpr,
                         D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, P: tl.constexpr,
                         PAGE_ROWS: tl.constexpr, HEAD_ROWS: tl.constexpr, V_OFF: tl.constexpr, IEEE: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    length = tl.load(Lens + b)
    n_blocks = tl.cdiv(length, BLOCK_N)
    per_split = tl.cdiv(n_blocks, NUM_SPLITS)
    first = s * per_split
    last = tl.minimum(first + per_split, n_blocks)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    gmask = g < G
    dmask = d < D
    q = tl.load(Q + b * stride_qb + (h * G + g)[:, None] * stride_qh + d[None, :],
                mask=gmask[:, None] & dmask[None, :], other=0.0)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for blk in range(first, last):
        t = blk * BLOCK_N + tl.arange(0, BLOCK_N)
        tmask = t < length
        page = tl.load(Table + b * stride_tb + t // P, mask=tmask, other=0).to(tl.int64)
        row = page * PAGE_ROWS + layer_off + h * HEAD_ROWS + t % P
        m_i, l_i, acc = _block(q, KV, row, tmask, tmask[None, :], d, dmask, m_i, l_i, acc, scale, D, V_OFF, IEEE)
    has = last > first
    out = tl.where(has, acc / tl.where(l_i > 0, l_i, 1.0)[:, None], 0.0)
    lse = tl.where(has, m_i + tl.log(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
    heads = h * G + g
    tl.store(O + ((b * (G * tl.num_programs(1)) + heads) * NUM_SPLITS + s)[:, None] * D + d[None, :], out,
             mask=gmask[:, None] & dmask[None, :])
    tl.store(LSE + (b * (G * tl.num_programs(1)) + heads) * NUM_SPLITS + s, lse, mask=gmask)


@triton.jit
def _merge_splits_kernel(O, LSE, OUT, NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, D: tl.constexpr,
                         BLOCK_D: tl.constexpr):
    """One program per (row, query head): out = sum_s w_s * o_s with w = softmax(lse) over the splits
    (an empty split has lse -inf: weight 0), in fp32, cast to OUT's dtype. Replaces torch's softmax,
    product, sum and cast (4 kernels)."""
    r = tl.program_id(0)  # row * Hq + head: O is [B * Hq, NUM_SPLITS, D], LSE [B * Hq, NUM_SPLITS]
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    smask = s < NUM_SPLITS
    lse = tl.load(LSE + r * NUM_SPLITS + s, mask=smask, other=float("-inf"))
    m = tl.max(lse, 0)
    w = tl.exp(lse - tl.where(m == float("-inf"), 0.0, m))
    total = tl.sum(w, 0)
    w = w / tl.where(total > 0, total, 1.0)  # every row has a split with keys (length >= 1); never 0 / 0
    o = tl.load(O + (r * NUM_SPLITS + s)[:, None] * D + d[None, :], mask=smask[:, None] & (d < D)[None, :], other=0.0)
    tl.store(OUT + r * D + d, tl.sum(w[:, None] * o, 0).to(OUT.dtype.element_ty), mask=d < D)


@triton.jit(do_not_specialize=["layer_off", "start", "end", "n"])
def _extend_kernel(Q, KV, Table, O, layer_off, start, end, n, stride_qt, stride_qh, stride_ot, stride_oh,
                   scale, G: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, P: tl.constexpr, PAGE_ROWS: tl.constexpr, HEAD_ROWS: tl.constexpr,
                   V_OFF: tl.constexpr, IEEE: tl.constexpr):
    mblk = tl.program_id(0)
    hq = tl.program_id(1)
    h = hq // G
    m = mblk * BLOCK_M + tl.arange(0, BLOCK_M)
    mmask = m < n
    qpos = start + m
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    q = tl.load(Q + m[:, None] * stride_qt + hq * stride_qh + d[None, :], mask=mmask[:, None] & dmask[None, :],
                other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    hi = tl.minimum(end, start + (mblk + 1) * BLOCK_M)  # causal: no key after the block's last query
    for kb in range(tl.cdiv(hi, BLOCK_N)):
        t = kb * BLOCK_N + tl.arange(0, BLOCK_N)
        tmask = t < hi
        page = tl.load(Table + t // P, mask=tmask, other=0).to(tl.int64)
        row = page * PAGE_ROWS + layer_off + h * HEAD_ROWS + t % P
        allowed = tmask[None, :] & (t[None, :] <= qpos[:, None])
        m_i, l_i, acc = _block(q, KV, row, tmask, allowed, d, dmask, m_i, l_i, acc, scale, D, V_OFF, IEEE)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(O + m[:, None] * stride_ot + hq * stride_oh + d[None, :], out.to(O.dtype.element_ty),
             mask=mmask[:, None] & dmask[None, :])


def num_splits(batch: int, kv_heads: int, max_blocks: int, sms: int) -> int:
    """Splits per (sequence, KV head): enough programs to fill the device twice, never more splits
    than a sequence has blocks, a power of two (a few launch shapes: CUDA graphs capture one each)."""
    want = max(1, math.ceil(2 * sms / max(1, batch * kv_heads)))
    return max(1, min(1 << (want - 1).bit_length(), 1 << (max(1, max_blocks) - 1).bit_length(), 64))


def _geometry(pool):
    a = pool.arch
    # (rows of a page, rows of one KV head in a page, rows from K to V, BLOCK_D): KVPool's head-major page
    return (a.num_kv_heads * pool.head_row_stride, pool.head_row_stride, pool.page_size,
            triton.next_power_of_2(a.head_dim))


def paged_decode(q: torch.Tensor, pool, layer: int, table: torch.Tensor, lens: torch.Tensor,
                 splits: int, block_n: int = 64) -> torch.Tensor:
    """q [B, Hq, D] -> [B, Hq * D]; table [B, W] int32, lens [B] int32 (device)."""
    B, Hq, D = q.shape
    H = pool.arch.num_kv_heads
    G = Hq // H
    page_rows, head_rows, v_off, block_d = _geometry(pool)
    q = q.contiguous()
    o = torch.empty(B, Hq, splits, D, dtype=torch.float32, device=q.device)
    lse = torch.empty(B, Hq, splits, dtype=torch.float32, device=q.device)
    _decode_split_kernel[(B, H, splits)](
        q, pool.rows, table, lens, o, lse, layer * pool.layer_row_stride, q.stride(0), q.stride(1),
        table.stride(0), D ** -0.5, NUM_SPLITS=splits, G=G, BLOCK_G=max(16, triton.next_power_of_2(G)), D=D,
        BLOCK_D=block_d, BLOCK_N=block_n, P=pool.page_size, PAGE_ROWS=page_rows, HEAD_ROWS=head_rows,
        V_OFF=v_off, IEEE=q.dtype == torch.float32)
    if splits == 1:
        return o[:, :, 0].to(q.dtype).reshape(B, Hq * D)
    out = torch.empty(B, Hq * D, dtype=q.dtype, device=q.device)
    _merge_splits_kernel[(B * Hq,)](o, lse, out, NUM_SPLITS=splits, BLOCK_S=triton.next_power_of_2(splits), D=D,
                                    BLOCK_D=block_d)
    return out


def paged_extend(q: torch.Tensor, pool, layer: int, table: torch.Tensor, start: int, end: int,
                 block_m: int = 64, block_n: int = 64) -> torch.Tensor:
    """q [n, Hq, D] of positions start..end-1 -> [n, Hq, D]; table [ceil(end / P)] (device)."""
    n, Hq, D = q.shape
    G = Hq // pool.arch.num_kv_heads
    page_rows, head_rows, v_off, block_d = _geometry(pool)
    out = torch.empty_like(q)
    ieee = q.dtype == torch.float32
    # NOTE: fp32 tiles of 64 x 128 with ieee dots at 4 warps take ~7 s each to compile (sm_90, measured
    # with Triton's compiler on a CPU host); 8 warps ~2.5 s, and fewer registers per thread
    warps = 8 if ieee and block_d >= 128 and block_m >= 64 else 4
    _extend_kernel[(triton.cdiv(n, block_m), Hq)](
        q, pool.rows, table, out, layer * pool.layer_row_stride, start, end, n, q.stride(0), q.stride(1),
        out.stride(0), out.stride(1), D ** -0.5, G=G, D=D, BLOCK_D=block_d, BLOCK_M=block_m, BLOCK_N=block_n,
        P=pool.page_size, PAGE_ROWS=page_rows, HEAD_ROWS=head_rows, V_OFF=v_off, IEEE=ieee, num_warps=warps)
    return out
