"""Attention backends on the CPU: the paged backend equals the torch reference on mixed batches
(decode rows of different lengths, fresh prefills, chunks on a cached prefix), and the Triton
kernels, run by Triton's interpreter, equal a float64 attention over the same pages."""

import pytest
import torch

from engine.attention import resolve_backend
from engine.attention.batch import build_batch, stage
from engine.kv_pool import KVPool
from engine.loader import load_model
from engine.model_runner import Chunk, ModelRunner

PAGE = 4


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    torch.set_num_threads(2)
    return load_model(tiny_model_dir)


def tokens(n, seed):
    return torch.randint(3, 40000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def script():
    """Forwards of a small serving run: prefills (fresh and on a prefix), mixed batches, decode batches."""
    seqs = {i: tokens(n, i) for i, n in enumerate((9, 17, 4, 30, 12))}
    tables = {0: [3, 7, 1], 1: [10, 2, 8, 9, 11], 2: [0, 4], 3: [12, 13, 14, 15, 16, 17, 18, 19], 4: [20, 21, 22, 23]}
    steps = [
        [Chunk(tables[0], 0, seqs[0][:8]), Chunk(tables[1], 0, seqs[1][:5])],
        [Chunk(tables[1], 5, seqs[1][5:16]), Chunk(tables[0], 8, seqs[0][8:9]), Chunk(tables[2], 0, seqs[2][:3])],
        [Chunk(tables[1], 16, seqs[1][16:17]), Chunk(tables[2], 3, seqs[2][3:4]), Chunk(tables[3], 0, seqs[3][:26])],
        [Chunk(tables[3], 26, seqs[3][26:29]), Chunk(tables[4], 0, seqs[4][:12])],
        [Chunk(tables[i], n - 1, seqs[i][n - 1:n]) for i, n in ((0, 9), (1, 17), (2, 4), (3, 30), (4, 12))],
    ]
    return steps


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16])
def test_paged_backend_equals_reference(tiny, kv_dtype):
    arch, model = tiny
    runners = {name: ModelRunner(model, arch, KVPool(arch, 24, PAGE, kv_dtype), attention=name)
               for name in ("torch", "paged")}
    for step in script():
        ref = runners["torch"].forward(step)
        got = runners["paged"].forward(step)
        assert torch.allclose(got, ref, atol=2e-5, rtol=1e-5), (got - ref).abs().max()
    a, b = runners["torch"].pool.tensor.float(), runners["paged"].pool.tensor.float()
    assert torch.allclose(a, b, atol=1e-4) and torch.equal(a[:, 0], b[:, 0])  # layer 0: the same writes


def test_backend_names():
    assert resolve_backend("auto", torch.device("cpu")) == "torch"
    assert resolve_backend("auto", torch.device("cuda", 1)) == "paged"
    assert resolve_backend("paged", torch.device("cpu")) == "paged"
    with pytest.raises(ValueError, match="one of auto, torch, paged"):
        resolve_backend("flash", torch.device("cpu"))


def test_stage_packs_every_array_into_one_copy():
    out = stage({"a": [1, 2, 3], "b": [], "c": [7]}, torch.device("cpu"))
    assert out["a"].tolist() == [1, 2, 3] and out["b"].numel() == 0 and out["c"].tolist() == [7]
    assert out["a"].untyped_storage().data_ptr() == out["c"].untyped_storage().data_ptr()  # one buffer


def test_kv_rows_address_the_page_slot_of_each_token(tiny):
    arch, _ = tiny
    pool = KVPool(arch, 8, PAGE)
    batch = build_batch([Chunk([5, 2], 0, [1] * 6), Chunk([7, 3], 5, [1])], pool, torch.device("cpu"))
    pool.rows[batch.kv_rows + 1 * pool.layer_row_stride] = 1.0  # layer 1
    for tok, (page, slot) in enumerate([(5, 0), (5, 1), (5, 2), (5, 3), (2, 0), (2, 1), (3, 1)]):
        assert bool((pool.layer_view(1)[page, :, :, slot] == 1).all()), tok
    assert float(pool.tensor.sum()) == 7 * 2 * arch.num_kv_heads * arch.head_dim
    assert batch.decode_table.tolist() == [[7, 3]] and batch.decode_lens.tolist() == [6]
