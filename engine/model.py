"""DecoderModel: the decoder-only transformer of every family in engine/families.py, in plain torch:
RMSNorm, RoPE, GQA, a SwiGLU MLP, tied or untied embeddings, optional q/k/v, o and MLP biases and
per-head q/k RMSNorm (Qwen3). The family's facts arrive in ModelArch; no if-chains on names here.

The model owns weights and per-token math only. Attention over the KV cache is a callback
(`attend(layer, q, k, v) -> out`) supplied by the ModelRunner, which owns the paged pool; so
this file knows nothing about pages.

Shapes: T = tokens in the flattened batch, Hq / Hkv = query / KV heads, D = head_dim.
q/k/v and gate/up are fused into one matmul each (fewer, larger GEMMs: less Python per token);
the loader assembles the fused weights (and biases) from the checkpoint's separate tensors.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from engine.arch import ModelArch
from engine.rope import RotaryTable, apply_rotary

Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Same op order as HF's LlamaRMSNorm / Qwen3RMSNorm (fp32 statistics, weight applied in the input dtype).
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _param(*shape, **kw) -> nn.Parameter:
    # NOTE: empty, not zeros: the loader writes every element, and untouched pages of a CPU tensor cost no RSS.
    return nn.Parameter(torch.empty(*shape, **kw), requires_grad=False)


class DecoderLayer(nn.Module):
    def __init__(self, arch: ModelArch, dtype: torch.dtype, device):
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
    def __init__(self, arch: ModelArch, dtype: torch.dtype = torch.float32, device="cpu"):
        super().__init__()
        self.arch = arch
        self.dtype = dtype
        self.device = torch.device(device)
        kw = {"dtype": dtype, "device": self.device}
        self.embed = _param(arch.vocab_size, arch.hidden_size, **kw)
        self.layers = nn.ModuleList(DecoderLayer(arch, dtype, self.device) for _ in range(arch.num_layers))
        self.norm = _param(arch.hidden_size, **kw)
        # NOTE: tied embeddings share one tensor (no copy); loader sets lm_head otherwise.
        self.lm_head = self.embed if arch.tie_word_embeddings else _param(arch.vocab_size, arch.hidden_size, **kw)
        self.rope = RotaryTable(arch, self.device)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, logit_rows: torch.Tensor,
                attend: Attend, max_pos: int) -> torch.Tensor:
        """input_ids/positions [T]; returns logits [len(logit_rows), vocab] (fp32) at those rows."""
        a = self.arch
        eps, hq, hkv, d = a.rms_norm_eps, a.num_heads, a.num_kv_heads, a.head_dim
        cos, sin = self.rope.cos_sin(positions, max_pos, self.dtype)
        x = F.embedding(input_ids, self.embed)
        for i, layer in enumerate(self.layers):
            h = rms_norm(x, layer.input_norm, eps)
            q, k, v = torch.split(F.linear(h, layer.qkv, layer.qkv_bias), layer.sizes, dim=-1)
            q, k = q.view(-1, hq, d), k.view(-1, hkv, d)
            if layer.q_norm is not None:  # Qwen3: RMSNorm over each head's D, before RoPE
                q, k = rms_norm(q, layer.q_norm, eps), rms_norm(k, layer.k_norm, eps)
            attn = attend(i, apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v.view(-1, hkv, d))
            x = x + F.linear(attn, layer.o, layer.o_bias)                       # attn: [T, Hq * D]
            h = rms_norm(x, layer.post_norm, eps)
            gate, up = torch.split(F.linear(h, layer.gate_up, layer.gate_up_bias), layer.ffn, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer.down, layer.down_bias)
        x = rms_norm(x[logit_rows], self.norm, eps)
        return F.linear(x, self.lm_head).float()
