"""RestoreBacklog: the pages a master leader switch lost, written again a few chunks at a time.

After a switch the store client's audit may hand a worker thousands of lost pages at once (a master
restarted at its own address lost everything; store_client/recent_writes.py). The store I/O queue
drops the saves that come while it holds `store.max_pending_save_pages` pages, so one submission of
them all would hold it far past that (every page pinned until the last is written) and drop the
saves behind it. Both workers (prefill_node/persistence.py, decode_node/restore.py)
keep the lost page hashes here instead and submit `chunk_pages` at a time, at most `in_flight`
chunks queued, the next one as each lands: the rewrite leaves room for the step and write-back
saves beside it and never drops itself.

By hash, not page id: a page may leave L1 while it waits; the worker's `submit(hashes)` looks up
the pages still holding them when their turn comes. Scheduler thread only.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

LOST = "lost_on_leader_change"  # unpersisted: the new leader lacked it; waiting for (or failed) its rewrite
CHUNK_PAGES = 64
IN_FLIGHT_CHUNKS = 2  # 128 pages queued at most: half the I/O queue's default budget (256)


class RestoreBacklog:
    def __init__(self, chunk_pages: int = CHUNK_PAGES, in_flight: int = IN_FLIGHT_CHUNKS):
        self.chunk_pages, self.max_in_flight = chunk_pages, in_flight
        self._waiting: dict[str, None] = {}  # page hashes in order, each once
        self.in_flight = 0

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, hashes) -> None:
        self._waiting.update(dict.fromkeys(hashes))

    def clear(self) -> None:
        self._waiting.clear()

    def pump(self, submit: Callable[[list[str]], bool]) -> None:
        """Submit chunks while fewer than max_in_flight are queued. `submit(hashes)` writes the
        pages still holding these hashes and answers whether it submitted a write (its completion
        must call landed())."""
        while self.in_flight < self.max_in_flight and self._waiting:
            chunk = list(itertools.islice(self._waiting, self.chunk_pages))
            for h in chunk:
                del self._waiting[h]
            if submit(chunk):
                self.in_flight += 1

    def landed(self) -> None:
        """One chunk's write completed (written, failed or dropped)."""
        self.in_flight = max(0, self.in_flight - 1)


def still_lost(alloc, hashes: list[str]) -> list[int]:
    """The pages that still hold `hashes` and are still lost (a page may have left L1, or been written,
    while its hash waited in the backlog); retained for the rewrite the caller submits."""
    pages = [p for p in alloc.pages_of(hashes) if alloc.unpersisted_reason(p) == LOST]
    alloc.retain(pages)
    return pages
