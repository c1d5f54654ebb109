"""ModelRunner on the tiny model: paged chunked prefill and batched decode reproduce a plain
one-shot prefill of the same tokens, and pages land where the page table says."""

import pytest
import torch

from engine.kv_pool import KVPool
from engine.loader import load_model
from engine.model_runner import Chunk, ModelRunner

PAGE = 4


@pytest.fixture(scope="module")
def runner(tiny_model_dir):
    torch.set_num_threads(2)
    arch, model = load_model(tiny_model_dir)
    return ModelRunner(model, arch, KVPool(arch, num_pages=64, page_size=PAGE))


def tokens(n, seed):
    return torch.randint(3, 40000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def one_shot(runner, toks):
    """Logits of the last token from a fresh prefill into pages 40.. (a disjoint region)."""
    pages = list(range(40, 40 + -(-len(toks) // PAGE)))
    return runner.forward([Chunk(pages, 0, toks)])[0]


def test_pool_layout_and_addresses(runner):
    pool, arch = runner.pool, runner.arch
    assert pool.tensor.shape == (64, arch.num_kv_heads, arch.num_layers, 2, PAGE, arch.head_dim)
    assert pool.page_nbytes == arch.kv_values_per_token * PAGE * 4
    assert pool.page_addr(3) - pool.page_addr(2) == pool.page_nbytes
    assert pool.page_addrs([0, 5]) == [pool.base_ptr, pool.base_ptr + 5 * pool.page_nbytes]
    with pytest.raises(IndexError):
        pool.page_addr(64)


def test_kv_written_to_page_table_slots(runner):
    toks = tokens(6, 1)
    runner.pool.tensor.zero_()
    runner.forward([Chunk([9, 3], 0, toks)])   # positions 0-3 -> page 9, 4-5 -> page 3 slots 0-1
    t = runner.pool.tensor
    assert t[9].abs().sum(dim=(0, 1, 2, 4)).ne(0).tolist() == [True] * 4
    assert t[3].abs().sum(dim=(0, 1, 2, 4)).ne(0).tolist() == [True, True, False, False]
    assert t[[0, 1, 2, 4]].abs().sum() == 0


def test_chunked_prefill_matches_one_shot(runner):
    toks = tokens(23, 2)
    ref = one_shot(runner, toks)
    pages = [7, 1, 12, 30, 2, 5]
    for start in range(0, 23, 7):
        logits = runner.forward([Chunk(pages, start, toks[start:start + 7])])[0]
    assert torch.allclose(logits, ref, atol=1e-5)


def test_mixed_batch_of_decode_and_prefill(runner):
    seqs = [tokens(n, 10 + n) for n in (5, 9, 14, 3)]
    refs = [one_shot(runner, s) for s in seqs]
    tables = [[0, 1, 2, 3], [4, 5, 6, 8], [10, 11, 13, 14], [15, 16]]
    # prefill all but the last token of the first three, the fourth is prefilled in the same call
    runner.forward([Chunk(t, 0, s[:-1]) for t, s in zip(tables[:3], seqs[:3])])
    out = runner.forward([Chunk(t, len(s) - 1, s[-1:]) for t, s in zip(tables[:3], seqs[:3])]
                         + [Chunk(tables[3], 0, seqs[3])])
    for got, ref in zip(out, refs):
        assert torch.allclose(got, ref, atol=1e-5)


def test_bad_chunks_are_rejected(runner):
    with pytest.raises(ValueError, match="needs 2 pages, got 1"):
        runner.forward([Chunk([0], 0, tokens(5, 0))])
    with pytest.raises(ValueError, match="outside the pool"):
        runner.forward([Chunk([0, 64], 0, tokens(5, 0))])
    with pytest.raises(ValueError, match="bad chunk"):
        runner.forward([Chunk([0], 0, [])])


def test_bf16_kv_pool_close_to_fp32(runner):
    """kv_dtype bfloat16: K/V are rounded on write and widened on read; compute stays fp32."""
    arch, model = runner.arch, runner.model
    half = ModelRunner(model, arch, KVPool(arch, num_pages=16, page_size=PAGE, dtype=torch.bfloat16))
    assert half.pool.page_nbytes * 2 == runner.pool.page_nbytes
    toks = tokens(19, 4)
    ref = one_shot(runner, toks)
    pages = list(range(5))
    half.forward([Chunk(pages, 0, toks[:-1])])
    got = half.forward([Chunk(pages, 18, toks[-1:])])[0]
    assert got.dtype == torch.float32 and got.argmax() == ref.argmax()
    assert (got - ref).abs().max() < 0.05
