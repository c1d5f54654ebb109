"""IOLeases: the I/O in flight on a request's pages, one named lease per submission.

A request's pages go back to the pool only when nothing reads or writes them any more. Each
submission that touches them takes a lease naming it; its completion gives back exactly that
lease; the pages may go once no lease is left. The names are the worker's own: a prefill task
starts each kind of I/O at most once (prefill_node/leases.py), a decode request holds one per step
write still reading its pages (decode_node/step_writes.py).

Taking a lease already held, or giving back one not held, is a bug (a lost or doubled completion
would release pages under running I/O, or never release them): it raises.
"""

from __future__ import annotations


class LeaseError(RuntimeError):
    """A lease taken twice or given back without being held."""


class IOLeases:
    """The leases one task holds (scheduler thread only)."""

    def __init__(self) -> None:
        self._held: set[str] = set()

    def take(self, lease: str) -> None:
        if lease in self._held:
            raise LeaseError(f"I/O lease {lease!r} taken twice")
        self._held.add(lease)

    def give_back(self, lease: str) -> None:
        if lease not in self._held:
            raise LeaseError(f"I/O lease {lease!r} given back but not held (held: {sorted(self._held)})")
        self._held.remove(lease)

    def __contains__(self, lease: str) -> bool:
        return lease in self._held

    def __len__(self) -> int:
        return len(self._held)

    def __repr__(self) -> str:
        return f"IOLeases({sorted(self._held)})"
