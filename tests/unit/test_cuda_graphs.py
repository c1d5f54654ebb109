"""CUDA-graph decode: bucket choice, the one-copy staging and the incremental page table (pure; capture
needs a GPU)."""

import random

import pytest
import torch

from engine.cuda_graphs import batch_buckets, bucket_for, graph_memory_bytes
from engine.decode_staging import DecodeStaging
from engine.model_runner import Chunk


def test_buckets():
    assert batch_buckets(1) == [1]
    assert batch_buckets(8) == [1, 2, 4, 8]
    assert batch_buckets(40) == [1, 2, 4, 8, 16, 32, 40]
    assert batch_buckets(128) == [1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 112, 128]
    b = batch_buckets(40)
    assert [bucket_for(n, b) for n in (1, 3, 8, 9, 17, 33, 40, 41)] == [1, 4, 8, 16, 32, 40, 40, None]


def staged(st: DecodeStaging, table: torch.Tensor, chunks, b: int) -> tuple[list[list[int]], int]:
    """Stage, copy the buffer as the graphs do (here CPU to CPU), apply: (head ids/pos/pages/lens, cells sent)."""
    n, updates = st.stage(chunks, b)
    device_buf = torch.full((st.host.numel(),), -7, dtype=torch.int32)
    device_buf[:n] = st.host[:n]
    st.apply(table, device_buf, b, updates)
    return [device_buf[i * b:(i + 1) * b].tolist() for i in range(4)], updates


def test_staging_layout_pads_into_the_scratch_page():
    P, W, b, scratch = 4, 3, 4, 99
    st, table = DecodeStaging(4, W, P, scratch), torch.full((4, W), -7, dtype=torch.int32)
    chunks = [Chunk([5, 6, 7], 9, [11]),  # position 9 -> page index 2 (page 7), slot 1
              Chunk([3], 0, [12])]
    (ids, pos, pages, lens), _ = staged(st, table, chunks, b)
    assert ids == [11, 12, 0, 0] and pos == [9, 0, 0, 0] and pages == [7, 3, scratch, scratch]
    assert lens == [10, 1, 1, 1]
    assert table[0].tolist() == [5, 6, 7] and table[1, 0] == 3 and table[2, 0] == table[3, 0] == scratch


def test_the_page_table_sends_only_the_cells_that_changed_and_always_equals_a_fresh_one():
    """Steps of a decode batch: rows advance (a page every P steps), finish, and are replaced by other
    requests, some sharing a prefix page. After every step the device table holds every row's pages
    below its length (what the kernels read), and the cells sent are the ones that changed."""
    P, W, scratch = 4, 12, 63
    st, table = DecodeStaging(8, W, P, scratch), torch.full((8, W), -7, dtype=torch.int32)
    rng = random.Random(5)
    free = list(range(60))
    rng.shuffle(free)
    rows = [[free.pop(), 0] for _ in range(5)]  # [pages..., position]: a list per request

    def chunks():
        return [Chunk(r[:-1], r[-1], [1]) for r in rows]

    _, first = staged(st, table, chunks(), 8)
    assert first == 8  # every row's first page, and the padding rows' scratch page
    for step in range(40):
        crossed = 0
        for r in rows:
            r[-1] += 1
            if r[-1] // P + 1 > len(r) - 1:  # a new page
                r.insert(-1, free.pop())
                crossed += 1
        replaced = 0
        if step % 9 == 8:  # a request ends; a new one starts on the finished one's prefix page
            gone = rows.pop(rng.randrange(len(rows)))
            free.extend(gone[1:-1])
            rows.insert(rng.randrange(len(rows) + 1), [gone[0], free.pop(), P + 1])
            replaced = 1
        b = 8 if len(rows) > 4 else 4
        _, sent = staged(st, table, chunks(), b)
        for i, r in enumerate(rows):
            pages = r[:-1][:r[-1] // P + 1]
            assert table[i, :len(pages)].tolist() == pages, (step, i)
        assert table[len(rows):b, 0].tolist() == [scratch] * (b - len(rows))
        if not replaced:
            assert sent == crossed  # one cell per row that entered a new page, nothing else
    _, sent = staged(st, table, chunks(), 8)
    assert sent == 0  # nothing changed: nothing travels


def test_a_row_longer_than_the_graph_is_refused():
    with pytest.raises(ValueError, match="does not fit a graph of 2 pages per row"):
        DecodeStaging(2, 2, 4, 0).stage([Chunk([1, 2, 3], 8, [5])], 2)


def test_graph_memory_reserve_counts_every_buckets_logits():
    assert graph_memory_bytes(8, 1000) == (1 + 2 + 4 + 8) * 1000 * 6
    assert graph_memory_bytes(0, 1000) == 0
