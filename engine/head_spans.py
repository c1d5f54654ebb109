"""Which bytes of a page go from one TP rank's pool to another's: the KV transfer between workers of
different TP sizes (P at TP p, D at TP d, each rank's pool holding its own KV heads).

Pages are head-major (engine/kv_pool.py): inside a page, KV head h of a pool is the contiguous span
[h * head_nbytes, (h + 1) * head_nbytes), and `head_nbytes` is the same in every pool of the model
(same layers, page size, head_dim and KV dtype: the fingerprint says so). So the heads two ranks
share are ONE contiguous span of each side's page, and a transfer between them is one write (or
read) of that span per page, straight between the pools:

    sender heads   [a, b)    receiver heads [c, e)    shared [max(a, c), min(b, e))
    sender offset  (max(a, c) - a) * head_nbytes      receiver offset (max(a, c) - c) * head_nbytes

Replicated heads (tp_size > num_kv_heads: several ranks hold the same head): every receiver holding
a head gets it, from ONE sender, the lowest rank that holds it, so no span is written twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class HeadSpan:
    peer: int           # the other side's rank (index into its list of ranks)
    local_offset: int   # bytes into this rank's page
    peer_offset: int    # bytes into the peer's page
    nbytes: int


def send_spans(rank: int, senders: Sequence[range], receivers: Sequence[range], head_nbytes: int) -> list[HeadSpan]:
    """The spans sender `rank` writes, one per receiver it shares heads with (and owns them for)."""
    spans = []
    mine = _owned(rank, senders)
    for peer, theirs in enumerate(receivers):
        lo, hi = max(mine.start, theirs.start), min(mine.stop, theirs.stop)
        if lo < hi:
            spans.append(HeadSpan(peer, (lo - senders[rank].start) * head_nbytes, (lo - theirs.start) * head_nbytes,
                                  (hi - lo) * head_nbytes))
    return spans


def read_spans(rank: int, readers: Sequence[range], sources: Sequence[range], head_nbytes: int) -> list[HeadSpan]:
    """The spans reader `rank` reads so that every head of its pool is read once, each from the
    lowest source rank holding it. ValueError when a head is held by no source."""
    spans, want = [], readers[rank]
    h = want.start
    while h < want.stop:
        peer = next((i for i, s in enumerate(sources) if s.start <= h < s.stop), None)
        if peer is None:
            raise ValueError(f"KV head {h} is held by no rank of the other worker (its ranks hold {list(sources)})")
        hi = min(want.stop, sources[peer].stop)
        spans.append(HeadSpan(peer, (h - want.start) * head_nbytes, (h - sources[peer].start) * head_nbytes,
                              (hi - h) * head_nbytes))
        h = hi
    return spans


def _owned(rank: int, senders: Sequence[range]) -> range:
    """The heads of sender `rank` that no lower sender holds (all of them unless replicated)."""
    mine = senders[rank]
    start = mine.start
    for other in senders[:rank]:
        if other.start <= start < other.stop:
            start = min(mine.stop, other.stop)
    return range(start, mine.stop)
