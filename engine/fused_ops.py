"""The decoder layer's elementwise steps, as torch ops or as fused Triton kernels (CUDA).

    add_rms_norm(x, delta, weight, eps) -> (rms_norm(x + delta), x + delta)
    silu_mul(gate_up, ffn)              -> silu(gate) * up, gate_up = [gate | up] along the last dim
    rotary_store(q, k, v, cos, sin, dest, rows, layer_off)
                                        -> RoPE of q and of k (engine/rope.py apply_rotary), and the
                                           rotated k and v written into the KV pool's rows `dest` at
                                           rows[t, 0=K|1=V, head] + layer_off (the attention backend's
                                           kv_target), cast to the pool's dtype; returns (q, k) rotated

DecoderModel (engine/model.py) adds each sub-layer's output into the residual stream through
add_rms_norm with the norm that follows it (the next layer's input norm takes the MLP's output), so
a layer runs 2 norm kernels, 1 SwiGLU and 1 RoPE-and-K/V-write kernel instead of ~30 small ops
(RMSNorm alone is 8: cast, square, mean, add, rsqrt, mul, cast, mul; RoPE 5 for q and 5 for k; the
K/V write 3: the layer's row offset, stack, index_put). Both versions round
where the torch code does: the sum in the input dtype, the norm's statistics in fp32, the normalised
value cast to the input dtype and then multiplied by the weight in it (HF's LlamaRMSNorm); silu in
fp32, cast, then times up in the input dtype; RoPE's two products each rounded, then their sum.

`TorchOps` is the reference and the CPU path; `TritonOps` runs on CUDA (and in Triton's interpreter
on CPU: tests/unit/test_triton_kernels.py). Which one a GPU worker uses is chosen by measurement
(bench/gpu_check/run.py times a decode step with each); until that measurement exists the torch ops are used.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.rope import apply_rotary


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Same op order as HF's LlamaRMSNorm / Qwen3RMSNorm (fp32 statistics, weight applied in the input dtype).
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


class TorchOps:
    name = "torch"

    @staticmethod
    def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float):
        s = x + delta
        return rms_norm(s, weight, eps), s

    @staticmethod
    def silu_mul(gate_up: torch.Tensor, ffn: int) -> torch.Tensor:
        gate, up = torch.split(gate_up, ffn, dim=-1)
        return F.silu(gate) * up

    @staticmethod
    def rotary_store(q, k, v, cos, sin, dest: torch.Tensor, rows: torch.Tensor, layer_off: int):
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        dest[rows + layer_off] = torch.stack((k, v), dim=1).to(dest.dtype)  # one index_put of every K and V row
        return q, k


class TritonOps:
    name = "triton"

    @staticmethod
    def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float):
        from engine import fused_kernels

        return fused_kernels.add_rms_norm(x, delta, weight, eps)

    @staticmethod
    def silu_mul(gate_up: torch.Tensor, ffn: int) -> torch.Tensor:
        from engine import fused_kernels

        return fused_kernels.silu_mul(gate_up, ffn)

    @staticmethod
    def rotary_store(q, k, v, cos, sin, dest: torch.Tensor, rows: torch.Tensor, layer_off: int):
        from engine import fused_kernels

        return fused_kernels.rotary_store(q, k, v, cos, sin, dest, rows, layer_off)


OPS = {o.name: o for o in (TorchOps, TritonOps)}
