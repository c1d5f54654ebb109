"""Cases for tests/unit/test_triton_kernels.py, run in a child process started with TRITON_INTERPRET=1
(Triton decides at import whether its kernels are interpreted, so they cannot share a process with
code that imported it compiled). Each case compares a kernel with float64 attention over the pages."""

from __future__ import annotations

import json
import sys
import traceback

import torch
import triton.runtime.interpreter as _interp

from engine.attention import triton_kernels as tk

_patch_lang_tensor = _interp._patch_lang_tensor


def _patch_index(tensor, scope):
    """NOTE: Triton 3.6's interpreter turns a scalar (held as a 1-element array) into a Python int
    with int(array), which NumPy >= 2.3 refuses for arrays of one dimension; this takes the item."""
    _patch_lang_tensor(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))


_interp._patch_lang_tensor = _patch_index
from engine.kv_pool import KVPool
from engine.reference.kernel_checks import PoolArch as Arch
from engine.reference.kernel_checks import attention64, rotary_store_errors, run_kernels


def decode_case(page, heads, kv_heads, head_dim, dtype, splits) -> float:
    """Largest error of paged_decode over 4 sequences of different lengths in scattered pages."""
    torch.manual_seed(page)
    pool = KVPool(Arch(2, kv_heads, heads, head_dim), 40, page, dtype)
    pool.tensor.normal_()
    lens = [1, 7, 33, 70]
    perm = torch.randperm(40).tolist()
    tables, used = [], 0
    for n in lens:
        k = -(-n // page)
        tables.append(perm[used:used + k])
        used += k
    width = max(map(len, tables))
    table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    # NOTE: q stays fp32: the interpreter's tl.dot on bf16 operands is wrong (NumPy has no bf16), so
    # the bf16 case here is a bf16 pool read into fp32 math; bf16 x bf16 runs in bench/gpu_check/run.py.
    q = torch.randn(len(lens), heads, head_dim)
    out = tk.paged_decode(q, pool, 1, table, torch.tensor(lens, dtype=torch.int32), splits, block_n=16)
    assert out.shape == (len(lens), heads * head_dim) and out.dtype == q.dtype
    return max(float((out[i].double() - attention64(q[i:i + 1].float(), pool, 1, tables[i], n - 1, n)
                      .reshape(-1)).abs().max()) for i, n in enumerate(lens))


def extend_case(start, end, page) -> float:
    """Largest error of paged_extend for a chunk at start..end-1 on a cached prefix."""
    torch.manual_seed(end)
    pool = KVPool(Arch(3, 2, 4, 16), 30, page)
    pool.tensor.normal_()
    table = torch.randperm(30)[:-(-end // page)]
    q = torch.randn(end - start, 4, 16)
    out = tk.paged_extend(q, pool, 2, table, start, end, block_m=16, block_n=16)
    return float((out.double() - attention64(q, pool, 2, table.tolist(), start, end)).abs().max())


def fused_case(op: str) -> float:
    """Largest error of a fused kernel (engine/fused_kernels.py) against TorchOps, relative to the largest |value|."""
    from engine.fused_ops import TorchOps, TritonOps

    torch.manual_seed(3)
    if op == "add_rms_norm":
        x, delta, w = torch.randn(5, 100), torch.randn(5, 100), torch.randn(100)
        (y, s), (ry, rs) = TritonOps.add_rms_norm(x, delta, w, 1e-5), TorchOps.add_rms_norm(x, delta, w, 1e-5)
        return max(float((y - ry).abs().max() / ry.abs().max()), float((s - rs).abs().max() / rs.abs().max()))
    if op == "rotary_store":  # q, k and v as the model has them: views of one qkv row per token
        # NOTE: an fp16 pool for the cast: the interpreter truncates fp32 -> bf16 (NumPy has no bf16; the
        # GPU rounds to nearest, as torch), so a bf16 pool is checked by bench/gpu_check/run.py on the GPU.
        return max(rotary_store_errors(torch.float32, torch.float32), rotary_store_errors(torch.float32, torch.float16))
    gate_up = torch.randn(3, 2 * 1500) * 4
    y, ref = TritonOps.silu_mul(gate_up, 1500), TorchOps.silu_mul(gate_up, 1500)
    return float((y - ref).abs().max() / ref.abs().max())


def fused_model_case() -> float:
    """A tiny random Llama's logits with TritonOps against TorchOps (a prefill, then a decode step on it)."""
    from engine.arch import ModelArch
    from engine.fused_ops import TorchOps, TritonOps
    from engine.model import DecoderModel
    from engine.model_runner import Chunk, ModelRunner

    arch = ModelArch.from_config({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
                                  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                  "vocab_size": 128, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
                                  "tie_word_embeddings": False})
    torch.manual_seed(4)
    model = DecoderModel(arch)
    for p in model.parameters():
        p.normal_(1.0 if p.dim() == 1 else 0.0, 0.2)
    out = {}
    for ops in (TorchOps, TritonOps):
        model.ops = ops
        runner = ModelRunner(model, arch, KVPool(arch, 8, 16), "torch")
        first = runner.forward([Chunk([0, 1], 0, list(range(3, 20)))])
        out[ops.name] = torch.cat([first, runner.forward([Chunk([0, 1], 17, [9])])])
    return float((out["triton"] - out["torch"]).abs().max() / out["torch"].abs().max())


CASES = {
    "decode_p4_fp32_1split": lambda: decode_case(4, 4, 2, 16, torch.float32, 1),
    "decode_p16_fp32_4splits": lambda: decode_case(16, 6, 2, 32, torch.float32, 4),
    "decode_p8_bf16_pool_mha_d24": lambda: decode_case(8, 3, 3, 24, torch.bfloat16, 2),
    "extend_fresh": lambda: extend_case(0, 21, 4),
    "extend_on_prefix": lambda: extend_case(13, 40, 4),
    "extend_one_token": lambda: extend_case(32, 33, 16),
    "extend_long_prefix": lambda: extend_case(50, 90, 8),
    # bench/gpu_check/run.py's kernel grid at small sizes (its GPU run covers it whole, fp32 and bf16)
    "grid_smoke": lambda: run_kernels("cpu", ("float32",), smoke=True),
    "fused_add_rms_norm": lambda: fused_case("add_rms_norm"),
    "fused_silu_mul": lambda: fused_case("silu_mul"),
    "fused_rotary_store": lambda: fused_case("rotary_store"),
    "fused_model_logits": fused_model_case,
}


def main() -> None:
    out = {}
    for name, case in CASES.items():
        try:
            out[name] = case()
        except Exception:  # noqa: BLE001 - reported to the parent test
            out[name] = traceback.format_exc()
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
