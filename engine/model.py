"""DecoderModel: the decoder-only transformer of every family in engine/families.py, in plain torch:
RMSNorm, RoPE, GQA, a SwiGLU MLP, tied or untied embeddings, optional q/k/v, o and MLP biases and
per-head q/k RMSNorm (Qwen3). The family's facts arrive in ModelArch; no if-chains on names here.

The model owns weights and per-token math only. Attention over the KV cache is the ModelRunner's
backend (engine/attention/base.py), which owns the paged pool: it names the rows where a layer's new
K/V go (`kv_target`, written here together with RoPE: one fused kernel with TritonOps) and attends
(`attend(layer, q, k, v) -> out`); so this file knows nothing about pages.

Shapes: T = tokens in the flattened batch, Hq / Hkv = query / KV heads, D = head_dim.
q/k/v and gate/up are fused into one matmul each (fewer, larger GEMMs: less Python per token);
the loader assembles the fused weights (and biases) from the checkpoint's separate tensors.

Tensor parallel (engine/tensor_parallel.py): a rank holds its heads' rows of qkv, its ffn columns'
rows of gate_up (column-parallel), the matching columns of o and down (row-parallel: the partial
sums are all-reduced, then the bias added once) and its vocabulary rows of embed and lm_head; so
the shapes above are the rank's (`local_arch`) and the attention callback sees its heads only.
At tp_size 1 every collective is skipped: the ops are those of the plain model.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from engine.arch import ModelArch
from engine.fused_ops import TorchOps, rms_norm
from engine.rope import RotaryTable
from engine.tensor_parallel import NO_TP, TPGroup, TPShard


class Attention(Protocol):
    """engine/attention/base.py AttentionBackend, begun on the batch."""

    def kv_target(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, int]: ...

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


def _param(*shape, **kw) -> nn.Parameter:
    # NOTE: empty, not zeros: the loader writes every element, and untouched pages of a CPU tensor cost no RSS.
    return nn.Parameter(torch.empty(*shape, **kw), requires_grad=False)


class DecoderLayer(nn.Module):
    def __init__(self, arch: ModelArch, dtype: torch.dtype, device):
        """`arch` is the rank's (TPShard.local_arch): its heads and ffn columns; h is never split."""
        super().__init__()
        q, kv, h, f = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim, arch.hidden_size, \
            arch.intermediate_size
        kw = {"dtype": dtype, "device": device}
        self.input_norm = _param(h, **kw)
        self.post_norm = _param(h, **kw)
        self.qkv = _param(q + 2 * kv, h, **kw)
        self.o = _param(h, q, **kw)
        self.gate_up = _param(2 * f, h, **kw)
        self.down = _param(h, f, **kw)
        self.qkv_bias = _param(q + 2 * kv, **kw) if arch.qkv_bias else None
        self.o_bias = _param(h, **kw) if arch.o_bias else None
        self.gate_up_bias = _param(2 * f, **kw) if arch.mlp_bias else None
        self.down_bias = _param(h, **kw) if arch.mlp_bias else None
        self.q_norm = _param(arch.head_dim, **kw) if arch.qk_norm else None
        self.k_norm = _param(arch.head_dim, **kw) if arch.qk_norm else None
        self.sizes = (q, kv, kv)
        self.ffn = f


class DecoderModel(nn.Module):
    def __init__(self, arch: ModelArch, dtype: torch.dtype = torch.float32, device="cpu",
                 shard: TPShard = NO_TP, group: TPGroup | None = None):
        super().__init__()
        self.arch = arch                          # the whole model's (config.json)
        self.local_arch = shard.local_arch(arch)  # this rank's heads and ffn columns: for its KVPool and runner
        group = group if group is not None else TPGroup()
        if (group.rank, group.size) != (shard.rank, shard.size):
            raise ValueError(f"the shard is tp rank {shard.rank} of tp_size={shard.size}, its TP group rank "
                             f"{group.rank} of {group.size} (tp_size > 1 needs the group of init_tp_group)")
        self.shard, self.group = shard, group
        self.dtype = dtype
        self.device = torch.device(device)
        kw = {"dtype": dtype, "device": self.device}
        self.vocab = shard.vocab_rows(arch)
        rows = shard.vocab_per_rank(arch)
        self.embed = _param(rows, arch.hidden_size, **kw)
        self.layers = nn.ModuleList(DecoderLayer(self.local_arch, dtype, self.device) for _ in range(arch.num_layers))
        self.norm = _param(arch.hidden_size, **kw)
        # NOTE: tied embeddings share one tensor (no copy); loader sets lm_head otherwise.
        self.lm_head = self.embed if arch.tie_word_embeddings else _param(rows, arch.hidden_size, **kw)
        with torch.no_grad():  # vocabulary padding (last rank): never looked up, its logits dropped; still zeros
            self.embed[len(self.vocab):].zero_()
            self.lm_head[len(self.vocab):].zero_()
        self.rope = RotaryTable(arch, self.device)
        self.ops = TorchOps  # engine/fused_ops.py: residual adds + norms, SwiGLU, RoPE (TritonOps: fused, CUDA)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, logit_rows: torch.Tensor,
                attention: Attention, max_pos: int) -> torch.Tensor:
        """input_ids/positions [T]; returns logits [len(logit_rows), vocab] (fp32) at those rows."""
        a = self.local_arch
        eps, hq, hkv, d = a.rms_norm_eps, a.num_heads, a.num_kv_heads, a.head_dim
        cos, sin = self.rope.cos_sin(positions, max_pos, self.dtype)
        x, ops = self._embed(input_ids), self.ops
        delta = None  # the last sub-layer's output, added into x together with the norm that follows it
        for i, layer in enumerate(self.layers):
            if delta is None:
                h = rms_norm(x, layer.input_norm, eps)
            else:
                h, x = ops.add_rms_norm(x, delta, layer.input_norm, eps)
            q, k, v = torch.split(F.linear(h, layer.qkv, layer.qkv_bias), layer.sizes, dim=-1)
            q, k = q.view(-1, hq, d), k.view(-1, hkv, d)
            if layer.q_norm is not None:  # Qwen3: RMSNorm over each head's D, before RoPE
                q, k = rms_norm(q, layer.q_norm, eps), rms_norm(k, layer.k_norm, eps)
            v = v.view(-1, hkv, d)
            q, k = ops.rotary_store(q, k, v, cos, sin, *attention.kv_target(i))
            attn = attention.attend(i, q, k, v)
            h, x = ops.add_rms_norm(x, self._row_parallel(attn, layer.o, layer.o_bias), layer.post_norm, eps)
            gate_up = F.linear(h, layer.gate_up, layer.gate_up_bias)
            delta = self._row_parallel(ops.silu_mul(gate_up, layer.ffn), layer.down, layer.down_bias)
        x = x[logit_rows] + delta[logit_rows]  # NOTE: only the rows whose logits are asked for
        return self._logits(rms_norm(x, self.norm, eps))

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.group.size == 1:
            return F.embedding(input_ids, self.embed)
        # Vocab-parallel: each id is in exactly one rank's rows; the others give zeros, the sum is exact.
        local = input_ids - self.vocab.start
        outside = (local < 0) | (local >= len(self.vocab))
        x = F.embedding(local.masked_fill(outside, 0), self.embed).masked_fill(outside[:, None], 0)
        return self.group.all_reduce(x)

    def _row_parallel(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x @ weight.T + bias with weight holding this rank's input columns: partial sums, reduced;
        the (replicated) bias added once, after the reduce."""
        if self.group.size == 1:
            return F.linear(x, weight, bias)
        out = self.group.all_reduce(F.linear(x, weight))
        return out if bias is None else out + bias

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        """Logits [rows, vocab] (fp32): each rank's vocabulary rows, gathered on rank 0, the padding
        dropped. NOTE: at tp_size > 1 the other ranks get their own rows only: nothing samples there."""
        logits = F.linear(x, self.lm_head)
        if self.group.size > 1:
            logits = self.group.gather_last_dim(logits)
            if self.group.rank == 0:
                logits = logits[:, :self.arch.vocab_size]
        return logits.float()
