"""One WatchKV subscriber of the KV event journal (pdorch/worker/kv_events.py): the batches it has
not read yet in a bounded queue, and how its stream ends. A subscriber whose queue is full is
dropped by the journal, never waited for."""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EventBatch:
    """One KVEventBatch (proto/pdorch/v1/worker.proto), without the proto."""

    epoch: str
    seq: int
    snapshot: bool = False
    l1_stored: tuple[str, ...] = ()
    l1_removed: tuple[str, ...] = ()
    store_written: tuple[str, ...] = ()
    store_removed: tuple[str, ...] = ()
    free_pages: int = 0
    queued: int = 0
    running: int = 0
    inflight_claimed: tuple[str, ...] = ()
    inflight_released: tuple[str, ...] = ()

    @property
    def num_hashes(self) -> int:
        return (len(self.l1_stored) + len(self.l1_removed) + len(self.store_written) + len(self.store_removed)
                + len(self.inflight_claimed) + len(self.inflight_released))


class StreamEnded(Exception):
    """The worker ended this subscription: `reason` is "slow", "overflow", "stopped", "full" (MAX_SUBSCRIBERS
    open already) or "unsubscribed"."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Subscription:
    """One subscriber: `initial` batches first, then get() until StreamEnded."""

    def __init__(self, name: str, max_batches: int):
        self.name = name
        self.initial: list[EventBatch] = []
        self._max = max_batches
        self._queue: deque[EventBatch] = deque()
        self._cv = threading.Condition()
        self.ended: str | None = None
        self._on_end: Callable[[], None] | None = None

    def get(self, timeout_s: float) -> EventBatch | None:
        """The next batch, None when none came within timeout_s; StreamEnded once the worker ended it
        (batches still queued then are not delivered: the subscriber resumes from the ring)."""
        with self._cv:
            self._cv.wait_for(lambda: self._queue or self.ended is not None, timeout_s)
            if self.ended is not None:
                raise StreamEnded(self.ended)
            return self._queue.popleft() if self._queue else None

    def on_end(self, fn: Callable[[], None]) -> None:
        """Call fn (once, from the thread that ends it) when the worker ends this subscription; at once
        if it already has."""
        with self._cv:
            if self.ended is None:
                self._on_end = fn
                return
        fn()

    def _offer(self, batch: EventBatch) -> bool:
        """Queue a batch; False when the queue is full (the subscriber fell behind)."""
        with self._cv:
            if self.ended is not None:
                return True
            if len(self._queue) >= self._max:
                return False
            self._queue.append(batch)
            self._cv.notify()
            return True

    def _end(self, reason: str) -> None:
        with self._cv:
            if self.ended is not None:
                return
            self.ended, fn, self._on_end = reason, self._on_end, None
            self._queue.clear()
            self._cv.notify_all()
        if fn is not None:
            try:
                fn()
            except Exception:  # the stream's own cleanup must not break the publisher
                log.exception("ending KV event subscription %s", self.name)
