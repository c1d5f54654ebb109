"""The KV index's numbers for /workers and the metrics: sizes, speculation outcomes, memory held.

Part of router/kv/index.py, in a file of its own for length: it reads the index's containers.
"""

from __future__ import annotations

import sys
from itertools import islice


def index_stats(index) -> dict:
    """`index`: a KVIndex (not imported: this file is part of it)."""
    spec_live = sum(len(w.spec) for w in index._workers.values())
    return {
        "workers": len(index._workers),
        "live_workers": sum(1 for a in index._workers if index.is_live(a)),
        "l1_pages": {a: len(w.l1) for a, w in index._workers.items()},
        "l1_entries": sum(len(w.l1) for w in index._workers.values()),
        "l1_distinct_pages": len(index._l1),
        "store_pages": len(index._store),
        "speculative_live": spec_live,
        "speculative_confirmed": index.spec_confirmed,
        "speculative_expired": index.spec_expired,
        "outcomes": dict(index.outcomes),
        "memory_bytes": memory_estimate(index),
    }


def memory_estimate(index) -> int:
    """Bytes held, from the containers' own sizes plus per-entry object sizes (O(workers), not
    O(pages): the per-page objects are counted by their number, not visited)."""
    size = sys.getsizeof
    total = (size(index._workers) + size(index._l1) + size(index._store.by_hash) + size(index._spec_q)
             + size(index._claim_q))
    total += index._store.per_worker_bytes()
    for w in index._workers.values():
        total += 200 + size(w.l1) + size(w.spec)  # 200: the slots object
    # the hash strings: one object per distinct hash per map (L1, store), ~113 bytes for 64 hex chars
    total += (len(index._l1) + len(index._store)) * size("0" * 64)
    for holders in (index._l1, index._store.by_hash):  # masks / sets of >= 2 holders (a str costs nothing)
        total += _multi_holder_bytes(holders)
    total += size(index._slot) + size(index._addr_at) + sum(size(v.by_addr) + size(v.slots) for v in index._views)
    total += sum(size(g) + size(g.hashes) for q in (index._spec_q, index._claim_q) for g in q)  # the guesses' sets (ttl's worth)
    return total


def _multi_holder_bytes(holders: dict) -> int:
    # NOTE: estimated from 512 evenly spaced entries (islice skips the rest in C): stats() is scraped
    n = len(holders)
    if n == 0:
        return 0
    sample = list(islice(holders.values(), 0, None, max(1, n // 512)))
    return sum(sys.getsizeof(v) for v in sample if type(v) is not str) * n // len(sample)
