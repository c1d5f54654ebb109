"""The paged backend: attention reads K/V in place from the page-first pool through page tables.

    decode            CUDA: Triton flash-decoding kernel (engine/attention/triton_kernels.py)
                      CPU:  the reference's copy + SDPA (reading in place, compiled by inductor, was
                            slower on CPU: docs/workers.md, "Attention backends")
    prefill, start 0  SDPA on the chunk's own K/V (nothing to read back from the pool)
    prefill on a      CUDA: Triton extend kernel (causal over the cached prefix and the chunk)
    cached prefix     CPU:  the reference's gather + SDPA: compute-bound (n x end x Hq x D work for
                      end x Hkv x D copied), so the copy costs ~1/(n x G) of the call

No padding to the longest sequence anywhere: each row reads only its own pages, to its own length.
Why Triton and not FlexAttention or flashinfer: docs/workers.md ("Attention backends").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.attention.base import AttentionBackend
from engine.attention.torch_ref import gather_pages


class PagedBackend(AttentionBackend):
    name = "paged"
    block_n = 64  # tokens per Triton iteration

    def __init__(self, pool, arch):
        super().__init__(pool, arch)
        self.cuda = pool.device.type == "cuda"
        if self.cuda:
            from engine.attention import triton_kernels

            self._kernels = triton_kernels
            self._sms = torch.cuda.get_device_properties(pool.device).multi_processor_count
        self.splits: int | None = None  # fixed by the CUDA-graph runner while it captures

    def begin(self, batch) -> None:
        super().begin(batch)
        P, H = self.pool.page_size, self.arch.num_kv_heads
        if batch.decode_table is None:
            return
        B, W = batch.decode_table.shape
        if self.cuda:
            self._splits = self.splits or self._kernels.num_splits(B, H, -(-W * P // self.block_n), self._sms)
            return
        self._table = batch.decode_table.long()
        mask = torch.arange(W * P, device=batch.input_ids.device)[None, :] < batch.decode_lens[:, None]
        self._mask = mask[:, None, None, :]

    def prefill(self, layer, i, q, k, v):
        pf = self.batch.prefills[i]
        if pf.start == 0:
            if k.dtype != self.pool.dtype:  # attend to what later steps will read back from the pool
                k, v = k.to(self.pool.dtype).to(q.dtype), v.to(self.pool.dtype).to(q.dtype)
            o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                               v.transpose(0, 1)[None], is_causal=True, enable_gqa=self.group > 1)
            return o[0].transpose(0, 1)
        if self.cuda:
            return self._kernels.paged_extend(q, self.pool, layer, pf.table, pf.start, pf.end)
        kv = gather_pages(self.pool.layer_view(layer), pf.table)[:, :, 0, :pf.end].to(q.dtype)  # [2, Hkv, end, D]
        kk, vv = (x.repeat_interleave(self.group, 0)[None] for x in (kv[0], kv[1]))
        pos = torch.arange(pf.start, pf.end, device=q.device)
        mask = torch.arange(pf.end, device=q.device)[None, :] <= pos[:, None]
        return F.scaled_dot_product_attention(q.transpose(0, 1)[None], kk, vv, attn_mask=mask)[0].transpose(0, 1)

    def decode(self, layer, q):
        b = self.batch
        if self.cuda:
            return self._kernels.paged_decode(q, self.pool, layer, b.decode_table, b.decode_lens, self._splits,
                                              self.block_n)
        kk, vv = gather_pages(self.pool.layer_view(layer), self._table).transpose(1, 2).to(q.dtype)
        o = F.scaled_dot_product_attention(q[:, :, None, :], kk, vv, attn_mask=self._mask, enable_gqa=self.group > 1)
        return o.reshape(q.shape[0], -1)
