"""The spans of a KV transfer between TP sizes: applied to real pages, every receiver rank ends up
with exactly its heads of the whole page, each byte written once (replicated heads included)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from engine.arch import ModelArch
from engine.head_spans import read_spans, send_spans
from engine.tensor_parallel import TPShard

HEAD = 6  # bytes of one KV head in a page


def arch(hq: int, hkv: int) -> ModelArch:
    return ModelArch(vocab_size=16, hidden_size=hq * 4, intermediate_size=16, num_layers=1, num_heads=hq,
                     num_kv_heads=hkv, head_dim=4, rope_theta=1e4)


def heads_of(a: ModelArch, size: int) -> list[range]:
    return [TPShard(r, size).kv_heads(a) for r in range(size)]


CASES = [(hq, hkv, p, d) for hq, hkv in ((4, 2), (8, 8), (8, 1), (8, 4))
         for p, d in itertools.product((1, 2, 4, 8), repeat=2)
         if hq % p == 0 and hq % d == 0 and all((s <= hkv and hkv % s == 0) or (s > hkv and s % hkv == 0)
                                                for s in (p, d))]


@pytest.mark.parametrize("hq, hkv, p, d", CASES)
def test_every_receiver_gets_its_heads_once(hq, hkv, p, d):
    a = arch(hq, hkv)
    whole = np.arange(hkv * HEAD, dtype=np.uint8)
    senders, receivers = heads_of(a, p), heads_of(a, d)
    pages = [whole[h.start * HEAD:h.stop * HEAD] for h in senders]
    got = [np.full(len(h) * HEAD, 255, dtype=np.uint8) for h in receivers]
    writes = np.zeros(d, dtype=int)
    for rank in range(p):
        for s in send_spans(rank, senders, receivers, HEAD):
            target = got[s.peer][s.peer_offset:s.peer_offset + s.nbytes]
            assert (target == 255).all(), "a span written twice"
            target[:] = pages[rank][s.local_offset:s.local_offset + s.nbytes]
            writes[s.peer] += s.nbytes
    for rank, h in enumerate(receivers):
        assert np.array_equal(got[rank], whole[h.start * HEAD:h.stop * HEAD])
        assert writes[rank] == len(h) * HEAD


@pytest.mark.parametrize("hq, hkv, p, d", CASES)
def test_every_reader_reads_its_heads_from_the_other_side(hq, hkv, p, d):
    a = arch(hq, hkv)
    whole = np.arange(hkv * HEAD, dtype=np.uint8)
    readers, sources = heads_of(a, p), heads_of(a, d)
    pages = [whole[h.start * HEAD:h.stop * HEAD] for h in sources]
    for rank, h in enumerate(readers):
        mine = np.full(len(h) * HEAD, 255, dtype=np.uint8)
        for s in read_spans(rank, readers, sources, HEAD):
            mine[s.local_offset:s.local_offset + s.nbytes] = pages[s.peer][s.peer_offset:s.peer_offset + s.nbytes]
        assert np.array_equal(mine, whole[h.start * HEAD:h.stop * HEAD])


def test_same_sizes_are_one_whole_page_per_pair():
    a = arch(8, 8)
    spans = send_spans(1, heads_of(a, 2), heads_of(a, 2), HEAD)
    assert [(s.peer, s.local_offset, s.peer_offset, s.nbytes) for s in spans] == [(1, 0, 0, 4 * HEAD)]


def test_a_head_no_source_holds_is_named():
    with pytest.raises(ValueError, match="KV head 1 is held by no rank"):
        read_spans(0, [range(2)], [range(1)], HEAD)
