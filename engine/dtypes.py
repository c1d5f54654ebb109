"""Which dtypes a worker computes and keeps KV in, from `model.dtype` / `model.kv_dtype` (torch-free:
the router and the benchmarks resolve them too, to know what the workers will agree on).

    dtype: auto      the checkpoint's own dtype (config.json `torch_dtype` / `dtype`) on a GPU, bfloat16 when
                     it does not say; float32 on CPU (no fast half-precision matmuls on AVX2 CPUs)
    kv_dtype: auto   the same as the resolved dtype
"""

from __future__ import annotations

from dataclasses import dataclass

DTYPES = ("float32", "bfloat16", "float16")
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ModelDtypes:
    compute: str  # weights and activations
    kv: str       # the KV pool, store objects and P->D transfers


def resolve_dtypes(dtype: str, kv_dtype: str, device: str, checkpoint_dtype: str | None) -> ModelDtypes:
    if dtype == "auto":
        on_gpu = device.startswith("cuda")
        dtype = (checkpoint_dtype if checkpoint_dtype in DTYPES else "bfloat16") if on_gpu else "float32"
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: one of auto, {', '.join(DTYPES)}")
    kv = dtype if kv_dtype == "auto" else kv_dtype
    if kv not in DTYPES:
        raise ValueError(f"kv_dtype {kv!r}: one of auto, {', '.join(DTYPES)}")
    return ModelDtypes(dtype, kv)
