"""AttentionBackend: what the ModelRunner hands DecoderModel as its `attention` (engine/model.py).

    begin(batch)                once per forward: whatever every layer shares (masks, indices, splits)
    kv_target(layer)            where the layer's new K/V go: (the pool's rows [N, D], layer-0 rows
                                [T, 2, Hkv] of each token's K and V, the layer's row offset); the
                                model writes them there together with RoPE (fused_ops.rotary_store)
    attend(layer, q, k, v)      attend, the new K/V already in the pool: the prefill chunks one call
                                each, the decode rows in one batched call -> [T, Hq * D]

A backend implements `prefill(layer, i, q, k, v)` (chunk i of batch.prefills; q/k/v are its rows)
and `decode(layer, q)` (the decode rows, [Bd, Hq, D] -> [Bd, Hq * D]). engine/attention/batch.py
has the row arithmetic.
"""

from __future__ import annotations

import torch

from engine.attention.batch import ForwardBatch


class AttentionBackend:
    name = "?"

    def __init__(self, pool, arch):
        if pool.arch.kv_values_per_token != arch.kv_values_per_token:
            raise ValueError("KV pool was built for another architecture")
        self.pool, self.arch = pool, arch
        self.group = arch.num_heads // arch.num_kv_heads
        self.batch: ForwardBatch | None = None

    def begin(self, batch: ForwardBatch) -> None:
        self.batch = batch

    def kv_target(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self.pool.rows, self.batch.kv_rows, layer * self.pool.layer_row_stride

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [T, Hq, D], k/v [T, Hkv, D] -> [T, Hq * D]; the layer's new K/V are in the pool (kv_target)."""
        b = self.batch
        if b.only_decode:  # rows are 0..T-1 in order: no scatter needed
            return self.decode(layer, q)
        T, Hq, D = q.shape
        out = torch.empty(T, Hq * D, dtype=q.dtype, device=q.device)
        for i, pf in enumerate(b.prefills):
            out[pf.rows] = self.prefill(layer, i, q[pf.rows], k[pf.rows], v[pf.rows]).reshape(-1, Hq * D)
        if b.decode_rows is not None:
            out[b.decode_rows] = self.decode(layer, q[b.decode_rows])
        return out

    def prefill(self, layer: int, i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def decode(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError
