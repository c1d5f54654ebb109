"""A Llama-family decoder in plain torch: RMSNorm, RoPE, GQA, SwiGLU, tied embeddings.

The model owns weights and per-token math only. Attention over the KV cache is a callback
(`attend(layer, q, k, v) -> out`) supplied by the ModelRunner, which owns the paged pool; so
this file knows nothing about pages.

Shapes: T = tokens in the flattened batch, Hq / Hkv = query / KV heads, D = head_dim.
q/k/v and gate/up are fused into one matmul each (fewer, larger GEMMs: less Python per token).
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
    # Same op order as HF's LlamaRMSNorm (fp32 statistics, weight applied in the input dtype).
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


class DecoderLayer(nn.Module):
    def __init__(self, arch: ModelArch, dtype: torch.dtype, device):
        super().__init__()
        q, kv, h, f = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim, arch.hidden_size, \
            arch.intermediate_size
        kw = {"dtype": dtype, "device": device}
        self.input_norm = nn.Parameter(torch.ones(h, **kw), requires_grad=False)
        self.post_norm = nn.Parameter(torch.ones(h, **kw), requires_grad=False)
        self.qkv = nn.Parameter(torch.empty(q + 2 * kv, h, **kw), requires_grad=False)
        self.o = nn.Parameter(torch.empty(h, q, **kw), requires_grad=False)
        self.gate_up = nn.Parameter(torch.empty(2 * f, h, **kw), requires_grad=False)
        self.down = nn.Parameter(torch.empty(h, f, **kw), requires_grad=False)
        self.sizes = (q, kv, kv)
        self.ffn = f


class LlamaModel(nn.Module):
    def __init__(self, arch: ModelArch, dtype: torch.dtype = torch.float32, device="cpu"):
        super().__init__()
        self.arch = arch
        self.dtype = dtype
        self.device = torch.device(device)
        kw = {"dtype": dtype, "device": self.device}
        self.embed = nn.Parameter(torch.empty(arch.vocab_size, arch.hidden_size, **kw), requires_grad=False)
        self.layers = nn.ModuleList(DecoderLayer(arch, dtype, self.device) for _ in range(arch.num_layers))
        self.norm = nn.Parameter(torch.ones(arch.hidden_size, **kw), requires_grad=False)
        # NOTE: tied embeddings share one tensor (no copy); loader sets lm_head otherwise.
        self.lm_head = self.embed if arch.tie_word_embeddings else nn.Parameter(
            torch.empty(arch.vocab_size, arch.hidden_size, **kw), requires_grad=False)
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
            q, k, v = torch.split(h @ layer.qkv.t(), layer.sizes, dim=-1)
            q = apply_rotary(q.view(-1, hq, d), cos, sin)
            k = apply_rotary(k.view(-1, hkv, d), cos, sin)
            attn = attend(i, q, k, v.view(-1, hkv, d))          # [T, Hq * D]
            x = x + attn @ layer.o.t()
            h = rms_norm(x, layer.post_norm, eps)
            gate, up = torch.split(h @ layer.gate_up.t(), layer.ffn, dim=-1)
            x = x + (F.silu(gate) * up) @ layer.down.t()
        x = rms_norm(x[logit_rows], self.norm, eps)
        return (x @ self.lm_head.t()).float()
