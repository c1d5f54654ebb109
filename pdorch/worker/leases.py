"""IOLeases: the I/O in flight on a request's pages, one lease per submission.

A request's pages go back to the pool only when nothing reads or writes them any more. Each
submission that touches them takes a lease naming it; its completion gives back exactly that
lease; the pages may go once no lease is left (`len(leases) == 0`). The names are each worker's:
prefill_node/leases.py (one of each kind per task), decode_node/step_writes.py (one per step write
a request's pages are in).

Taking a lease already held, or giving back one not held, is a bug (a lost or doubled completion
would release pages under running I/O, or never release them): it raises.
"""

from __future__ import annotations

from collections.abc import Hashable


class LeaseError(RuntimeError):
    """A lease taken twice or given back without being held."""


class IOLeases:
    """The leases one request holds (scheduler thread only)."""

    def __init__(self) -> None:
        self._held: set[Hashable] = set()

    def take(self, lease: Hashable) -> None:
        if lease in self._held:
            raise LeaseError(f"I/O lease {lease!r} taken twice")
        self._held.add(lease)

    def give_back(self, lease: Hashable) -> None:
        if lease not in self._held:
            raise LeaseError(f"I/O lease {lease!r} given back but not held (held: {sorted(map(str, self._held))})")
        self._held.remove(lease)

    def __contains__(self, lease: Hashable) -> bool:
        return lease in self._held

    def __len__(self) -> int:
        return len(self._held)

    def __repr__(self) -> str:
        return f"IOLeases({sorted(map(str, self._held))})"
