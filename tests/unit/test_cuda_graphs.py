"""CUDA-graph decode: bucket choice and the one-copy staging layout (pure; capture needs a GPU)."""

import pytest
import torch

from engine.cuda_graphs import batch_buckets, bucket_for, graph_memory_bytes, stage_decode, staging_size
from engine.model_runner import Chunk


def test_buckets():
    assert batch_buckets(1) == [1]
    assert batch_buckets(8) == [1, 2, 4, 8]
    assert batch_buckets(40) == [1, 2, 4, 8, 16, 32, 40]
    assert batch_buckets(128) == [1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 112, 128]
    b = batch_buckets(40)
    assert [bucket_for(n, b) for n in (1, 3, 8, 9, 17, 33, 40, 41)] == [1, 4, 8, 16, 32, 40, 40, None]


def test_staging_layout_pads_into_the_scratch_page():
    P, W, b, scratch = 4, 3, 4, 99
    host = torch.full((staging_size(b, W),), -7, dtype=torch.int32)
    chunks = [Chunk([5, 6, 7], 9, [11]),  # position 9 -> page index 2 (page 7), slot 1
              Chunk([3], 0, [12])]
    stage_decode(host, chunks, b, W, P, scratch)
    ids, pos, pages, lens = (host[i * b:(i + 1) * b].tolist() for i in range(4))
    table = host[4 * b:].view(b, W)
    assert ids == [11, 12, 0, 0] and pos == [9, 0, 0, 0] and pages == [7, 3, scratch, scratch]
    assert lens == [10, 1, 1, 1]
    assert table[0].tolist() == [5, 6, 7] and table[1, 0] == 3 and table[2, 0] == table[3, 0] == scratch


def test_a_row_longer_than_the_graph_is_refused():
    host = torch.zeros(staging_size(2, 2), dtype=torch.int32)
    with pytest.raises(ValueError, match="does not fit a graph of 2 pages per row"):
        stage_decode(host, [Chunk([1, 2, 3], 8, [5])], 2, 2, 4, 0)


def test_graph_memory_reserve_counts_every_buckets_logits():
    assert graph_memory_bytes(8, 1000) == (1 + 2 + 4 + 8) * 1000 * 6
    assert graph_memory_bytes(0, 1000) == 0
