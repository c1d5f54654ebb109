"""KV transfers between a worker's TP ranks and another worker's, for any pair of TP sizes.

Each rank moves the heads it shares with each peer rank (engine/head_spans.py): one transfer-engine
batch per (this rank, peer rank) pair, of one contiguous span per page. Between two single-rank
workers that is one whole page per page, as before TP.

`PoolRank` describes one rank's pool to a peer (PrefillRequest.decode_ranks carries D's). A
single-rank peer that sent no ranks is described by `single_rank`: every head, at the addresses
the request gave.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.head_spans import read_spans, send_spans


@dataclass(frozen=True)
class PoolRank:
    segment: str      # transfer-engine segment of the rank's process
    pool_base: int    # address of its page 0
    page_nbytes: int  # bytes of one of its pages
    heads: range      # the model's KV heads its pool holds

    @property
    def head_nbytes(self) -> int:
        return self.page_nbytes // len(self.heads)

    def page_addrs(self, page_ids: Sequence[int]) -> list[int]:
        return [self.pool_base + p * self.page_nbytes for p in page_ids]

    def page_ids(self, addrs: Sequence[int]) -> list[int]:
        """The page ids of page addresses in this pool (ValueError for one that is not a page start)."""
        out = []
        for a in addrs:
            page, rest = divmod(a - self.pool_base, self.page_nbytes)
            if rest or page < 0:
                raise ValueError(f"address {a:#x} is not a page of the pool at {self.pool_base:#x} "
                                 f"({self.page_nbytes} bytes a page)")
            out.append(page)
        return out


def single_rank(segment: str, num_kv_heads: int, head_nbytes: int) -> PoolRank:
    """A peer of one rank: every head, at the addresses given with each request (pool_base 0)."""
    return PoolRank(segment, 0, num_kv_heads * head_nbytes, range(num_kv_heads))


def move_heads(transfer, read: bool, rank: int, ranks: Sequence[PoolRank], local_page_ids: Sequence[int],
               peers: Sequence[PoolRank], peer_addrs: Sequence[Sequence[int]]) -> int:
    """This rank's share of a transfer: its heads of `local_page_ids`, to (or from) the peer ranks
    holding them at `peer_addrs[peer][i]`. Returns the bytes moved; raises on a failed batch."""
    me = ranks[rank]
    for peer in peers:
        if peer.head_nbytes != me.head_nbytes:
            raise ValueError(f"the peer's KV head takes {peer.head_nbytes} bytes a page, ours {me.head_nbytes}: "
                             "different page size, layers, head_dim or kv_dtype")
    mine, theirs = [r.heads for r in ranks], [p.heads for p in peers]
    spans = (read_spans if read else send_spans)(rank, mine, theirs, me.head_nbytes)
    moved = 0
    for s in spans:
        local = [a + s.local_offset for a in me.page_addrs(local_page_ids)]
        remote = [a + s.peer_offset for a in peer_addrs[s.peer]]
        op = transfer.read if read else transfer.write
        op(peers[s.peer].segment, local, remote, s.nbytes)
        moved += s.nbytes * len(local)
    return moved
