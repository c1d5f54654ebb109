"""ModelRunner: one forward pass over a mixed batch of chunks, with K/V kept in the paged pool.

A Chunk is `len(token_ids)` new tokens of one sequence at positions start_pos..end-1. Its
`page_ids` cover positions 0..end-1 (page i holds positions i*P .. i*P+P-1):

    positions   0 ........ P-1 | P ....... 2P-1 | 2P .. end-1
    page_ids    [   p0         |    p1          |    p2       ]
                 cached earlier (start_pos = P+3)^  new tokens ^end

Per layer: the new K/V are written into (page, slot) = (page_ids[pos // P], pos % P), then each
query attends to every key at positions <= its own, read back from the pool, so prefill on top
of cached pages, chunked prefill and decode share one code path. 1-token (decode) chunks are
batched into one padded SDPA call; longer (prefill) chunks get one causal SDPA call each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.arch import ModelArch
from engine.kv_pool import KVPool
from engine.model import DecoderModel


@dataclass(frozen=True)
class Chunk:
    page_ids: Sequence[int]
    start_pos: int
    token_ids: Sequence[int]

    @property
    def end(self) -> int:
        return self.start_pos + len(self.token_ids)


@dataclass
class _Prefill:
    rows: slice                 # rows of the flattened batch
    table: torch.Tensor         # page ids covering 0..end-1
    end: int
    mask: torch.Tensor | None   # [n, end] bool, None = plain causal (start_pos 0)


@dataclass
class _Decode:
    rows: torch.Tensor          # [B] rows of the flattened batch
    table: torch.Tensor         # [B, max_pages], padded with a valid page (masked out)
    mask: torch.Tensor          # [B, 1, 1, max_pages * P] bool: key position < end


class ModelRunner:
    def __init__(self, model: DecoderModel, arch: ModelArch, pool: KVPool):
        if pool.arch.kv_values_per_token != arch.kv_values_per_token:
            raise ValueError("KV pool was built for another architecture")
        self.model, self.arch, self.pool = model, arch, pool
        self.device = model.device
        self.group = arch.num_heads // arch.num_kv_heads

    def forward(self, chunks: Sequence[Chunk]) -> torch.Tensor:
        """Logits [len(chunks), vocab] (fp32) at each chunk's last token.

        NOTE: not re-entrant (the batch layout lives on self during the call): one forward at a
        time, from the worker's scheduler thread.
        """
        if not chunks:
            raise ValueError("forward() needs at least one chunk")
        P, dev = self.pool.page_size, self.device
        ids, pos, slot_page, rows_end, decode, prefills = [], [], [], [], [], []
        row = 0
        for c in chunks:
            n = len(c.token_ids)
            if n == 0 or c.start_pos < 0:
                raise ValueError(f"bad chunk: {n} tokens at start_pos {c.start_pos}")
            need = -(-c.end // P)
            if len(c.page_ids) < need:
                raise ValueError(f"chunk ending at position {c.end} needs {need} pages, got {len(c.page_ids)}")
            table = torch.as_tensor(list(c.page_ids[:need]), dtype=torch.long)
            if int(table.min()) < 0 or int(table.max()) >= self.pool.num_pages:
                raise ValueError(f"page ids {c.page_ids[:need]} outside the pool (0..{self.pool.num_pages - 1})")
            p = torch.arange(c.start_pos, c.end)
            ids.append(torch.as_tensor(list(c.token_ids), dtype=torch.long))
            pos.append(p)
            slot_page.append(table[p // P])
            if n == 1:
                decode.append((row, table, c.end))
            else:
                mask = None
                if c.start_pos:
                    k = torch.arange(c.end)
                    mask = (k[None, :] <= p[:, None]).to(dev)
                prefills.append(_Prefill(slice(row, row + n), table.to(dev), c.end, mask))
            row += n
            rows_end.append(row - 1)
        positions = torch.cat(pos)
        self._slots = (torch.cat(slot_page).to(dev), (positions % P).to(dev))
        self._prefills = prefills
        self._decode = self._decode_batch(decode) if decode else None
        max_pos = max(c.end for c in chunks)
        return self.model(torch.cat(ids).to(dev), positions.to(dev), torch.as_tensor(rows_end, device=dev),
                          self._attend, max_pos)

    def _decode_batch(self, decode) -> _Decode:
        P, dev = self.pool.page_size, self.device
        max_pages = max(len(t) for _, t, _ in decode)
        table = torch.stack([F.pad(t, (0, max_pages - len(t)), value=int(t[0])) for _, t, _ in decode])
        ends = torch.as_tensor([e for _, _, e in decode])
        mask = torch.arange(max_pages * P)[None, :] < ends[:, None]
        rows = torch.as_tensor([r for r, _, _ in decode])
        return _Decode(rows.to(dev), table.to(dev), mask[:, None, None, :].to(dev))

    def _attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [T, Hq, D], k/v [T, Hkv, D] -> [T, Hq * D]."""
        lv = self.pool.layer_view(layer)                       # [pages, 2, Hkv, P, D]
        pages, slots = self._slots
        lv[pages, :, :, slots] = torch.stack((k, v), dim=1).to(lv.dtype)
        T, Hq, D = q.shape
        G = self.group
        out = torch.empty(T, Hq, D, dtype=q.dtype, device=q.device)
        for pf in self._prefills:
            kv = _gather(lv, pf.table)[:, :, 0, :pf.end].to(q.dtype)            # [2, Hkv, end, D]
            qc = q[pf.rows].transpose(0, 1)[None]                                   # [1, Hq, n, D]
            # NOTE: SDPA takes its fast (flash) CPU kernel only for 4-D inputs; with a mask that
            # kernel is faster on repeated K/V than with enable_gqa (measured: 0.07 s vs 0.10 s).
            if pf.mask is None:
                o = F.scaled_dot_product_attention(qc, kv[0][None], kv[1][None], is_causal=True, enable_gqa=G > 1)
            else:
                kk, vv = (x.repeat_interleave(G, 0)[None] for x in (kv[0], kv[1]))
                o = F.scaled_dot_product_attention(qc, kk, vv, attn_mask=pf.mask)
            out[pf.rows] = o[0].transpose(0, 1)
        d = self._decode
        if d is not None:
            kk, vv = _gather(lv, d.table).transpose(1, 2).to(q.dtype)    # 2 x [B, Hkv, L, D]
            only_decode = not self._prefills  # then rows are 0..T-1 in order: no scatter needed
            qd = (q if only_decode else q[d.rows])[:, :, None, :]       # [B, Hq, 1, D]
            o = F.scaled_dot_product_attention(qd, kk, vv, attn_mask=d.mask, enable_gqa=G > 1)
            if only_decode:
                return o.reshape(T, Hq * D)
            out[d.rows] = o[:, :, 0, :]
        return out.view(T, Hq * D)


def _gather(lv: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
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
