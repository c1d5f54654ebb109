"""Candidates as the KV index sees them (router/kv/index.py), and the stable key of an address that
settles ties the same way in every router replica (router/kv/choice.py)."""

from __future__ import annotations

from hashlib import blake2b

_STABLE: dict[str, int] = {}


def stable_key(address: str) -> int:
    """A 64-bit key of an address, the same in every process (unlike hash()): deterministic ties."""
    k = _STABLE.get(address)
    if k is None:
        if len(_STABLE) > 1 << 17:  # addresses churned for a long time: forget the old ones
            _STABLE.clear()
        k = _STABLE[address] = int.from_bytes(blake2b(address.encode(), digest_size=8).digest(), "big")
    return k


class CandidateView:
    """Candidates (objects with .address) as the index sees them, built once per distinct list:
    by address, the mask of their slots, each one's slot (-1: unknown to the index), and the
    candidates in stable-key order (`order`, `keys`) for ties settled by a seed."""

    __slots__ = ("board_covers", "board_tag", "by_addr", "keys", "mask", "order", "order_slots", "slot_of", "slots",
                 "workers")

    def __init__(self, workers: list, slot: dict[str, int]):
        self.workers = list(workers)
        self.by_addr = {w.address: w for w in workers}
        self.slots = [slot.get(w.address, -1) for w in workers]
        self.slot_of = {w.address: s for w, s in zip(workers, self.slots)}
        self.board_tag, self.board_covers = None, False  # which LoadBoard holds exactly these (kv_choice)
        self.mask = 0
        for i in self.slots:
            if i >= 0:
                self.mask |= 1 << i
        pairs = sorted(((stable_key(w.address), i) for i, w in enumerate(workers)))
        self.keys = [k for k, _ in pairs]
        self.order = [workers[i] for _, i in pairs]
        self.order_slots = [self.slots[i] for _, i in pairs]
