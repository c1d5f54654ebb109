"""Admission control of the decode worker: a bounded wait queue and a KV-pool watermark.

A request is admitted when allocating its pages keeps the referenced pages at or under
`kv_watermark * total` (the headroom lets running requests grow page by page without running
dry). When it does not fit, the request waits, up to its deadline, for pages to come back;
at most `max_queued_requests` wait at once, beyond that new requests are rejected (RESOURCE_EXHAUSTED)
so the worker never crashes or queues without bound.

NOTE: this object also serializes every allocator call of the decode worker (handler threads
admit and release; the scheduler thread grows requests), so its lock guards the allocator.
"""

from __future__ import annotations

import threading
import time

from pdorch.worker.errors import Aborted, DeadlineExceeded, InvalidRequest, Overloaded

WAIT_SLICE_S = 0.25  # re-check cancellation this often while waiting for pages


class Admission:
    def __init__(self, allocator, max_queued: int, watermark: float):
        self._alloc = allocator
        self._max_queued = max_queued
        self._watermark = watermark
        self._cond = threading.Condition()
        self.waiting = 0

    def _fits(self, n: int) -> bool:
        total = self._alloc.num_total
        used = total - self._alloc.num_available()
        if used == 0:
            return n <= total  # an idle pool admits anything that fits at all (no starvation)
        return used + n <= self._watermark * total

    def admit(self, request_id: str, num_pages: int, deadline: float, is_cancelled) -> list[int]:
        """Allocate `num_pages`, waiting (bounded by `deadline`) while the pool is above the watermark."""
        if num_pages > self._alloc.num_total:
            raise InvalidRequest(f"request {request_id} needs {num_pages} KV pages; the pool has "
                                 f"{self._alloc.num_total} (decode.num_pages)")
        with self._cond:
            if self.waiting >= self._max_queued and not self._fits(num_pages):
                raise Overloaded(f"decode worker overloaded: {self.waiting} requests already wait for KV pages "
                                 f"(decode.max_queued_requests)")
            self.waiting += 1
            try:
                waited_since = time.monotonic()
                while not self._fits(num_pages):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise DeadlineExceeded(f"request {request_id} waited {time.monotonic() - waited_since:.1f}s "
                                               f"for {num_pages} KV pages and hit its deadline")
                    if is_cancelled():
                        raise Aborted(f"request {request_id} cancelled while waiting for KV pages")
                    self._cond.wait(min(remaining, WAIT_SLICE_S))
                return self._alloc.allocate(num_pages)
            finally:
                self.waiting -= 1

    def allocate(self, n: int) -> list[int]:
        """Pages for a running request (raises OutOfPages)."""
        with self._cond:
            return self._alloc.allocate(n)

    def release(self, page_ids: list[int]) -> None:
        with self._cond:
            self._alloc.release(page_ids)
            self._cond.notify_all()

    def locked(self, fn):
        """Run fn() while holding the allocator lock (flush, integrity checks, load figures)."""
        with self._cond:
            return fn()
