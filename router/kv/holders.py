"""Which workers hold each page in L1 (router/kv/index.py's inverted index): hash -> holders.

The L1 holders of a page are one address (most pages: no extra object) or, when several workers
hold it, a bitmask over per-index worker slots (a Python int): the index's walks intersect them in
a few machine words each, whatever the fleet size (a set intersection of 1,000 holders took ~15 µs).
A worker's slot is its bit; a dropped worker's slot is reused once no mask has its bit.

Pure logic, not thread-safe (the router's event loop owns the index and so this).
"""

from __future__ import annotations

from collections.abc import Iterable

from router.kv.candidates import CandidateView


# NOTE: `type(x) is str` rather than isinstance, as the index's walks test holders (per page); the type
# checker narrows only its true branch, hence the ignores where the holder is a mask.
class L1Holders:
    def __init__(self) -> None:
        self.by_hash: dict[str, str | int] = {}  # hash -> holder address, or mask of holder slots
        self.slot: dict[str, int] = {}  # address -> bit in the masks
        self.addr_at: list[str | None] = []  # slot -> address
        self._free_slots: list[int] = []

    # ------------------------------------------------------------------ slots
    def add_worker(self, address: str) -> None:
        """Give `address` a slot (a free one first)."""
        if self._free_slots:
            i = self._free_slots.pop()
            self.addr_at[i] = address
        else:
            i = len(self.addr_at)
            self.addr_at.append(address)
        self.slot[address] = i

    def drop_worker(self, address: str) -> None:
        """Free `address`'s slot; the caller has taken it out of every page it held (`unhold`)."""
        i = self.slot.pop(address)
        self.addr_at[i] = None
        self._free_slots.append(i)  # no mask has its bit any more

    # ------------------------------------------------------------------ holders of a page
    def hold(self, h: str, addr: str) -> None:
        holders = self.by_hash
        cur = holders.get(h)
        if cur is None:
            holders[h] = addr
        elif type(cur) is str:
            if cur != addr:
                slot = self.slot
                holders[h] = (1 << slot[cur]) | (1 << slot[addr])
        else:
            holders[h] = cur | (1 << self.slot[addr])  # type: ignore[operator]  # an int here (see the NOTE)

    def unhold(self, h: str, addr: str) -> None:
        holders = self.by_hash
        cur = holders.get(h)
        if cur is None:
            return
        if type(cur) is str:
            if cur == addr:
                del holders[h]
            return
        cur &= ~(1 << self.slot[addr])  # type: ignore[operator]  # an int here (see the NOTE)
        if cur & (cur - 1):
            holders[h] = cur
        elif cur:  # one left: back to its address
            holders[h] = self.addr_at[cur.bit_length() - 1]  # type: ignore[assignment]  # its bit is set: not None
        else:
            del holders[h]

    # ------------------------------------------------------------------ masks
    def bits(self, h_holders: str | int) -> int:
        """The mask of one page's holders (as `by_hash` keeps them)."""
        return (1 << self.slot[h_holders]) if type(h_holders) is str else h_holders  # type: ignore[return-value]

    def addresses_of(self, mask: int) -> list[str]:
        out: list[str] = []
        at = self.addr_at
        while mask:
            low = mask & -mask
            out.append(at[low.bit_length() - 1])  # type: ignore[arg-type]  # a set bit is a live slot
            mask ^= low
        return out

    def mask(self, addresses: CandidateView | Iterable[str]) -> int:
        """The mask of `addresses` (a CandidateView carries its own); addresses the index never saw add nothing."""
        if isinstance(addresses, CandidateView):
            return addresses.mask
        m, slot = 0, self.slot
        for a in addresses:
            i = slot.get(a)
            if i is not None:
                m |= 1 << i
        return m
