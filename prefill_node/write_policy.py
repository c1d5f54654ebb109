"""`store.write_policy` on the prefill worker: which L1 pages go to the store, and when.

The three policies SGLang's HiCache offers (docs/workers.md, "Write policies"):

    write_through            every computed full page, at compute time (with the request's write-back)
    write_through_selective  a page at its N-th use (`store.write_selective_uses`; computing it is use 1,
                             each L1 hit one more): one-off prompts never reach the store
    write_back               a page only when L1 gives it up: the write-before-evict path
                             (persistence.py) is its only write

A page whose write is put off stays in L1 as unpersisted, with the reason saying why:

    UNWRITTEN ("selective")  used too few times: L1 may drop it without writing it (a loss by policy,
                             its own allocator tier after the persisted pages), counted under that reason
    DEFERRED ("deferred")    write_back: written before L1 evicts it (allocator tier of the pages the
                             store lacks), never dropped unless the store cannot take it in time

Pages already due for a write keep being written as before, whatever the policy: a backfill (an L1
hit the store lacks after a failed write, a page read from the decode worker's pool: used again
here) under both write-through policies; under write_back they are deferred like the rest.
Without a prefill L1 (`prefill.prefix_cache: false`) there is nothing to count uses on or to give
pages up, so every policy writes at compute time.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.page_allocator import UNWRITTEN

WRITE_THROUGH = "write_through"
SELECTIVE = "write_through_selective"
WRITE_BACK = "write_back"
DEFERRED = "deferred"  # write_back: the page is written when L1 gives it up


@dataclass(frozen=True)
class WritePolicy:
    name: str = WRITE_THROUGH
    uses_to_write: int = 2  # write_through_selective: the use at which a page is written

    @classmethod
    def of(cls, store_cfg) -> WritePolicy:
        return cls(store_cfg.write_policy, store_cfg.write_selective_uses)

    def hold(self, alloc, page: int, why: str) -> str | None:
        """None: write the page now. Else the reason its write is put off (`why`: "computed",
        "backfill" or "selective", see Persister.save_task_pages)."""
        if self.name == WRITE_BACK:
            return DEFERRED
        if self.name == SELECTIVE and why == "computed" and alloc.uses(page) < self.uses_to_write:
            return UNWRITTEN
        return None

    def due(self, alloc, pages) -> list[int]:
        """Of `pages` (indexes into a task's page list), the held-back ones now used often enough."""
        if self.name != SELECTIVE:
            return []
        return [i for i, page in enumerate(pages)
                if alloc.unpersisted_reason(page) == UNWRITTEN and alloc.uses(page) >= self.uses_to_write]
