"""The reference backend: each sequence's pages copied out of the pool (padded to the longest for
decode), then SDPA with a mask. Plain torch, any device; what every other backend is tested against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.attention.base import AttentionBackend


class TorchReference(AttentionBackend):
    name = "torch"

    def begin(self, batch) -> None:
        super().begin(batch)
        dev = batch.input_ids.device
        self._masks = []
        for pf in batch.prefills:  # None = plain causal (start 0)
            k, p = torch.arange(pf.end, device=dev), torch.arange(pf.start, pf.end, device=dev)
            self._masks.append((k[None, :] <= p[:, None]) if pf.start else None)
        if batch.decode_table is not None:
            width = batch.decode_table.shape[1] * self.pool.page_size
            self._decode_table = batch.decode_table.long()
            mask = torch.arange(width, device=dev)[None, :] < batch.decode_lens[:, None]
            self._decode_mask = mask[:, None, None, :]                   # [B, 1, 1, L]

    def prefill(self, layer, i, q, k, v):
        pf, lv, G = self.batch.prefills[i], self.pool.layer_view(layer), self.group
        kv = gather_pages(lv, pf.table)[:, :, 0, :pf.end].to(q.dtype)            # [2, Hkv, end, D]
        qc = q.transpose(0, 1)[None]                                               # [1, Hq, n, D]
        # NOTE: SDPA takes its fast (flash) CPU kernel only for 4-D inputs; with a mask that kernel
        # is faster on repeated K/V than with enable_gqa (measured: 0.07 s vs 0.10 s).
        if self._masks[i] is None:
            o = F.scaled_dot_product_attention(qc, kv[0][None], kv[1][None], is_causal=True, enable_gqa=G > 1)
        else:
            kk, vv = (x.repeat_interleave(G, 0)[None] for x in (kv[0], kv[1]))
            o = F.scaled_dot_product_attention(qc, kk, vv, attn_mask=self._masks[i])
        return o[0].transpose(0, 1)

    def decode(self, layer, q):
        kk, vv = gather_pages(self.pool.layer_view(layer), self._decode_table).transpose(1, 2).to(q.dtype)
        o = F.scaled_dot_product_attention(q[:, :, None, :], kk, vv, attn_mask=self._decode_mask,
                                           enable_gqa=self.group > 1)             # [B, Hq, 1, D]
        return o.reshape(q.shape[0], -1)


def gather_pages(lv: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Pages of one layer -> [2, Hkv, B, pages * P, D]: keys/values of each head in position order.

    NOTE: one index_select over the page dim of the head-major view copies P x D blocks straight
    into place (measured ~3.5x faster than gathering whole pages then permuting, and ~25x faster
    than advanced indexing); SDPA takes the [B, Hkv, L, D] transpose of it without another copy.
    """
    table = table.view(-1, table.shape[-1])                      # [B, pages]
    B, n = table.shape
    two, hkv, _, P, D = lv.permute(1, 2, 0, 3, 4).shape
    g = lv.permute(1, 2, 0, 3, 4).index_select(2, table.flatten())   # [2, Hkv, B * pages, P, D]
    return g.view(two, hkv, B, n * P, D)
