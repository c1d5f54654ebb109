"""The Triton kernels on the CPU, run by Triton's interpreter in a child process (tests/unit/triton_cases.py,
started as the tests are collected): the paged backend's each equal float64 attention over the same pages;
the fused elementwise ones equal the torch ops they replace."""

import json

import pytest

from engine.attention.triton_kernels import num_splits
from tests.fixtures.early_children import early_child

TOLERANCE = {"bf16": 1e-5}  # a bf16 pool read into fp32 math; everything fp32 with ieee dot products


@pytest.fixture(scope="module")
def results():
    """The cases' results, from the child started when the tests were collected (tests/fixtures/early_children.py)."""
    code, out, err = early_child("triton_cases").result()
    assert code == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("case", ["decode_p4_fp32_1split", "decode_p16_fp32_4splits", "decode_p8_bf16_pool_mha_d24",
                                  "extend_fresh", "extend_on_prefix", "extend_one_token", "extend_long_prefix"])
def test_kernel_equals_float64(results, case):
    err = results[case]
    assert isinstance(err, float), err  # a traceback from the child
    assert err <= next((t for k, t in TOLERANCE.items() if k in case), 1e-5), err


def test_the_gpu_checks_kernel_grid_passes_in_the_interpreter(results):
    """bench/gpu_check/run.py's grid (shapes shrunk to what the interpreter runs in seconds), fp32: every case
    within its tolerance, every kernel and page size of the grid present."""
    grid = results["grid_smoke"]
    assert isinstance(grid, list), grid
    assert [e for e in grid if not e["ok"]] == []
    assert {(e["kernel"], e["page"]) for e in grid} == {(k, p) for k in ("paged_decode", "paged_extend") for p in (16, 64)}
    assert max(e["rel_err"] for e in grid) <= 1e-5


@pytest.mark.parametrize("case", ["fused_add_rms_norm", "fused_silu_mul", "fused_rotary_store", "fused_model_logits"])
def test_fused_kernels_equal_the_torch_ops(results, case):
    """engine/fused_kernels.py (TritonOps) against TorchOps, fp32: each op, and a tiny model's logits."""
    err = results[case]
    assert isinstance(err, float), err
    assert err <= 1e-5, err


@pytest.mark.parametrize("batch, kv_heads, blocks, sms, want", [
    (1, 8, 64, 132, 64), (1, 8, 3, 132, 4), (32, 8, 64, 132, 2), (128, 8, 64, 132, 1), (8, 8, 64, 132, 8)])
def test_split_count(batch, kv_heads, blocks, sms, want):
    assert num_splits(batch, kv_heads, blocks, sms) == want
