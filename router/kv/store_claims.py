"""What the store holds, as the router's KV index knows it (router/kv/index.py): the pages the
workers claim (they wrote them, or found them there when writing), by hash and by worker.

A page is held while some worker claims it; any worker's store_removed removes it for all (the
store is shared: one chain evictor's removal is everyone's). A worker that leaves or restarts takes
its claims along: the index then under-counts the store, which costs a store read, never a wrong one.

Pure logic: no grpc, no asyncio; not thread-safe (the router's event loop owns it).
"""

from __future__ import annotations

import sys
from itertools import takewhile


def _add(holders: dict, h: str, addr: str) -> None:
    """holders[h] is the one address holding h (the common case: a str costs nothing extra), or a set."""
    cur = holders.get(h)
    if cur is None:
        holders[h] = addr
    elif type(cur) is str:
        if cur != addr:
            holders[h] = {cur, addr}
    else:
        cur.add(addr)


def _discard(holders: dict, h: str, addr: str) -> None:
    cur = holders.get(h)
    if cur is None:
        return
    if type(cur) is str:
        if cur == addr:
            del holders[h]
        return
    cur.discard(addr)
    if len(cur) == 1:
        holders[h] = next(iter(cur))
    elif not cur:
        del holders[h]


class StoreClaims:
    __slots__ = ("_by_worker", "by_hash")

    def __init__(self):
        self.by_hash: dict[str, str | set[str]] = {}  # hash -> claiming address(es)
        self._by_worker: dict[str, set[str]] = {}  # address -> the hashes it claims

    def __len__(self) -> int:
        return len(self.by_hash)

    def run(self, hashes: list[str]) -> int:
        """The leading run of `hashes` the store holds."""
        return len(list(takewhile(self.by_hash.__contains__, hashes)))  # a C loop

    def write(self, address: str, hashes) -> None:
        mine = self._by_worker.setdefault(address, set())
        new = set(hashes)
        new -= mine
        if not new:
            return
        mine |= new
        claims = self.by_hash
        fresh = new.difference(claims)
        if fresh:
            claims.update(dict.fromkeys(fresh, address))
        if len(fresh) != len(new):
            for h in new.difference(fresh):
                _add(claims, h, address)

    def remove(self, hashes) -> None:
        """The store no longer holds these (whoever claimed them)."""
        claims, by_worker = self.by_hash, self._by_worker
        for h in hashes:
            cur = claims.pop(h, None)
            if cur is None:
                continue
            if type(cur) is str:
                by_worker[cur].discard(h)
            else:
                for a in cur:
                    by_worker[a].discard(h)

    def clear(self, address: str) -> None:
        """`address` claims nothing any more (a snapshot replaces its claims, or it left)."""
        claims = self.by_hash
        for h in self._by_worker.pop(address, ()):
            _discard(claims, h, address)

    def clear_all(self) -> None:
        self.by_hash.clear()
        self._by_worker.clear()

    def per_worker_bytes(self) -> int:
        return sum(map(sys.getsizeof, self._by_worker.values()))
