"""DrainWrites: a draining worker's write-back of the L1 pages the store lacks, a few chunks at a time
(pdorch/worker/drain.py waits for it; prefill_node/persistence.py and decode_node/drain_writeback.py
submit its chunks and report each one landed).

Why chunks: the store I/O queue's budget is `store.max_pending_save_pages` pages (256 by default;
store_client/io_thread.py). A drain that submitted its whole L1 in one save (a full prefill L1 is 512
pages by default, thousands on a GPU) was dropped whole when it came while the queue held its budget
(before, whenever it was larger than the budget) and wrote nothing, while the drain's log said it
wrote them all; taken, it holds the queue far past its budget. So the pages wait here by hash (RestoreBacklog: `chunk_pages` at a time, at most two chunks queued, the next
as each lands), and the drain counts what each landed chunk did: written, or failed (dropped, timed
out, no space). A page that left L1 or was written by someone else meanwhile is skipped.

Scheduler thread only (the submit callback touches the allocator).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engine.page_allocator import LEFT_STORE, PENDING
from pdorch.worker.restore_backlog import CHUNK_PAGES, IN_FLIGHT_CHUNKS, RestoreBacklog


@dataclass(frozen=True)
class WriteBackProgress:
    """A drain's write-back so far: pages to write, written, failed, skipped (nothing left to write)."""

    total: int
    written: int = 0
    failed: int = 0
    skipped: int = 0

    @property
    def left(self) -> int:
        """Pages whose write has not landed yet (queued, running, or waiting for their chunk)."""
        return self.total - self.written - self.failed - self.skipped


def chunk_pages_for(max_pending_save_pages: int) -> int:
    """Pages per chunk: the queued chunks take at most half the I/O queue's budget (the rest is for
    the saves beside them), and at most CHUNK_PAGES."""
    return max(1, min(CHUNK_PAGES, max_pending_save_pages // (2 * IN_FLIGHT_CHUNKS)))


class DrainWrites:
    """`submit(hashes)` writes the pages still holding these hashes that the store still lacks and
    answers how many it submitted (0: none, no completion comes); each submitted chunk's completion
    must call landed(written, pages)."""

    def __init__(self, hashes: Sequence[str], submit: Callable[[list[str]], int], chunk_pages: int):
        self._backlog = RestoreBacklog(chunk_pages, IN_FLIGHT_CHUNKS)
        self._backlog.add(hashes)
        self._submit = submit
        self.total = len(self._backlog)
        self.written = self.failed = self.skipped = 0

    def start(self) -> None:
        self._backlog.pump(self._chunk)

    def landed(self, written: int, pages: int) -> None:
        """One submitted chunk completed: `written` of its `pages` are in the store now."""
        self.written += written
        self.failed += pages - written
        self._backlog.landed()
        self._backlog.pump(self._chunk)

    def progress(self) -> WriteBackProgress:
        return WriteBackProgress(self.total, self.written, self.failed, self.skipped)

    def _chunk(self, hashes: list[str]) -> bool:
        submitted = self._submit(hashes)
        self.skipped += len(hashes) - submitted
        return submitted > 0


def still_unstored(alloc, hashes: list[str]) -> list[int]:
    """The pages that still hold `hashes` and that the store still lacks, but those being written
    (PENDING) and those the store dropped on purpose (LEFT_STORE: its eviction; writing them back
    would undo it): what a drain chunk writes (a page may have left L1, or been written, while its
    hash waited)."""
    return [p for p in alloc.pages_of(hashes) if not alloc.is_persisted(p)
            and alloc.unpersisted_reason(p) not in (PENDING, LEFT_STORE)]
