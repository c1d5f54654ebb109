"""The loads of a set of workers, kept by level: the least loaded one without reading every load.

router/kv/choice.py needs, per decision, the lowest load and the least loaded worker (ties: the
first in stable-key order at or after the prompt's seed, a ring). Reading 1,000 candidates' loads
costs 40-100 µs in Python (an attribute read per worker, cache misses), more than the rest of the
decision together (the fleet simulation, since removed: docs/benchmarks.md). Loads change far less often than they are read (a
request routed, a request done, an event batch), so whoever changes a load says so here, and the
decision reads a few levels: workers per load value, each level's stable keys sorted.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from itertools import chain

from router.kv.candidates import stable_key


class LoadBoard:
    __slots__ = ("_addr", "_levels", "_load", "version")

    def __init__(self, loads: dict[str, int] | None = None):
        self._load: dict[str, int] = {}
        self._addr: dict[int, str] = {}  # stable key -> address
        self._levels: dict[int, list[int]] = {}  # load -> stable keys at that load, sorted
        self.version = 0  # bumped when the set of workers changes (not their loads)
        for a, n in (loads or {}).items():
            self.set(a, n)

    def __len__(self) -> int:
        return len(self._load)

    def __contains__(self, address: str) -> bool:
        return address in self._load

    def load(self, address: str) -> int:
        return self._load[address]

    def loads_of(self, addresses: list[str]) -> list[int]:
        return list(map(self._load.__getitem__, addresses))  # NOTE: a C loop

    def set(self, address: str, load: int) -> None:
        old = self._load.get(address)
        if old == load:
            return
        key = stable_key(address)
        if old is None:
            if self._addr.setdefault(key, address) != address:  # a 64-bit collision: refuse, never misroute
                raise ValueError(f"stable key collision: {address!r} and {self._addr[key]!r}")
            self.version += 1
        else:
            self._leave(old, key)
        self._load[address] = load
        insort(self._levels.setdefault(load, []), key)

    def discard(self, address: str) -> None:
        old = self._load.pop(address, None)
        if old is not None:
            key = stable_key(address)
            self._leave(old, key)
            del self._addr[key]
            self.version += 1

    def _leave(self, load: int, key: int) -> None:
        keys = self._levels[load]
        del keys[bisect_left(keys, key)]
        if not keys:
            del self._levels[load]

    def low(self) -> int:
        """The lowest load (the board must not be empty). NOTE: min over the distinct load values,
        a few dozen at most, not over the workers."""
        return min(self._levels)

    def least(self, seed: int) -> str:
        """The least loaded worker: of those at the lowest load, the first stable key at or after
        `seed`, else the first (a ring)."""
        keys = self._levels[min(self._levels)]
        i = bisect_left(keys, seed)
        return self._addr[keys[i if i < len(keys) else 0]]

    def least_among(self, seed: int, mask: int, slot: dict[str, int]) -> str | None:
        """least() among the workers whose `slot` bit is set in `mask` (the holders of a prefix),
        None if none is on the board. Levels from the lowest; within one, the ring from `seed`."""
        addr = self._addr
        for level in sorted(self._levels):
            keys = self._levels[level]
            i = bisect_left(keys, seed)
            for j in chain(range(i, len(keys)), range(i)):
                a = addr[keys[j]]
                s = slot.get(a, -1)
                if s >= 0 and mask >> s & 1:
                    return a
        return None
