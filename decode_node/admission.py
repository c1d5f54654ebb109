"""Admission control of the decode worker: a bounded wait queue and a KV-pool watermark.

A request is admitted when allocating its pages, plus the pages kept back for the growth of the
requests already admitted and its own (decode_node/growth.py), keeps the referenced pages at or
under `kv_watermark * total`. With the decode worker's prefix cache on, its reusable prompt pages are
looked up first (`lookup`: their hashes): pages the pool still holds from an earlier request are
taken as they are (retained, shared) and only the others are allocated; `AdmitTicket.hits` says
which. (the headroom lets running requests grow page by page; when the pool runs dry anyway the
scheduler preempts, decode_node/preemption.py). While a preempted request waits to resume, no new
request is admitted: it goes first. When it does not fit, the request waits, up to its deadline,
for pages to come back;
at most `max_queued_requests` wait at once, beyond that new requests are rejected (RESOURCE_EXHAUSTED)
so the worker never crashes or queues without bound.

NOTE: runs on the decode scheduler thread only, which owns the allocator (the one concurrency
rule of both workers, pdorch/worker/loop.py). A handler thread posts an AdmitTicket and waits for
its future (DecodeScheduler.admit); the scheduler answers it from `admit_ready()` every iteration.
"""

from __future__ import annotations

import collections
import concurrent.futures
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from decode_node.growth import GrowthReserve
from pdorch.worker.errors import Aborted, DeadlineExceeded, InvalidRequest, Overloaded

PENDING_GRACE_S = 5.0  # an admitted request unsettled this long past its deadline is forgotten


@dataclass(eq=False)
class AdmitTicket:
    """One request asking for pages; `future` gets the page ids or the WorkerError."""

    request_id: str
    num_pages: int
    deadline: float  # time.monotonic() value
    is_cancelled: Callable[[], bool]
    lookup: tuple[str, ...] = ()  # hashes of the leading pages to look up in the prefix cache
    growth: int = 0  # pages it may still need after these (decode_node/growth.py growth_pages)
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    since: float = field(default_factory=time.monotonic)
    hits: tuple[int, ...] = ()  # set before the future: page indexes found in the prefix cache


class Admission:
    def __init__(self, allocator, max_queued: int, watermark: float, reserve: GrowthReserve | None = None):
        """`reserve`: the fraction of the admitted requests' growth kept back (None: nothing)."""
        self._alloc = allocator
        self._max_queued = max_queued
        self._watermark = watermark
        self._reserve = reserve
        self._queue: collections.deque[AdmitTicket] = collections.deque()
        # Admitted, not yet in the batch (P is prefilling them): request id -> (growth, deadline).
        # NOTE: counted here until Join or failure (settled()); the scheduler counts them after.
        self._pending: dict[str, tuple[int, float]] = {}
        self.waiting = 0  # tickets queued; other threads read it as a snapshot (load figures)

    def check_size(self, request_id: str, num_pages: int) -> None:
        """Any thread: a request larger than the whole pool can never be admitted."""
        if num_pages > self._alloc.num_total:
            raise InvalidRequest(f"request {request_id} needs {num_pages} KV pages; the pool has "
                                 f"{self._alloc.num_total} (decode.num_pages)")

    def _fits(self, n: int, growth: int = 0) -> bool:
        """n new pages fit, with the reserve for `growth` pages the admitted requests may need."""
        total = self._alloc.num_total
        used = total - self._alloc.num_available()
        if used == 0:
            return n <= total  # an idle pool admits anything that fits at all (no starvation)
        held_back = self._reserve.pages(growth) if self._reserve is not None else 0
        return used + n + held_back <= self._watermark * total

    def fits(self, n: int, growth: int) -> bool:
        """As admission judges it (the scheduler asks it for a preempted request's resume)."""
        return self._fits(n, growth + self.pending_growth())

    def pending_growth(self) -> int:
        return sum(g for g, _ in self._pending.values())

    def settled(self, request_id: str) -> None:
        """An admitted request joined the batch or failed: its growth is no longer counted here."""
        self._pending.pop(request_id, None)

    def offer(self, ticket: AdmitTicket) -> None:
        """Queue a ticket, or reject it at once when the wait queue is full and it does not fit."""
        if len(self._queue) >= self._max_queued and not self._fits(ticket.num_pages):
            _fail(ticket, Overloaded(f"decode worker overloaded: {len(self._queue)} requests already wait for "
                                     f"KV pages (decode.max_queued_requests)"))
            return
        self._queue.append(ticket)
        self.waiting = len(self._queue)

    def admit_ready(self, now: float, wake_at: Callable[[float], None], growth: int = 0, hold: bool = False) -> None:
        """Answer every queued ticket that fits (arrival order), is cancelled or is past its deadline.
        `growth`: pages the requests in the batch may still need; `hold`: admit nothing now (a
        preempted request waits to resume)."""
        for rid in [r for r, (_, deadline) in self._pending.items() if now > deadline + PENDING_GRACE_S]:
            del self._pending[rid]  # never settled (a handler that died): its deadline has passed anyway
        growth += self.pending_growth()
        keep: collections.deque[AdmitTicket] = collections.deque()
        for t in self._queue:
            if t.future.cancelled():  # its handler gave up waiting (DecodeScheduler.admit)
                continue
            if now > t.deadline:
                _fail(t, DeadlineExceeded(f"request {t.request_id} waited {now - t.since:.1f}s for "
                                          f"{t.num_pages} KV pages and hit its deadline"))
            elif t.is_cancelled():
                _fail(t, Aborted(f"request {t.request_id} cancelled while waiting for KV pages"))
            elif not hold and self._fits(t.num_pages, growth + t.growth):
                # NOTE: RUNNING first: from here on the handler can no longer cancel the future, so
                # the pages always reach it (no leak between its timeout and our answer).
                if t.future.set_running_or_notify_cancel():
                    t.future.set_result(self._pages(t))
                    self._pending[t.request_id] = (t.growth, t.deadline)
                    growth += t.growth
            else:
                keep.append(t)
                wake_at(t.deadline)
        self._queue = keep
        self.waiting = len(keep)

    def _pages(self, t: AdmitTicket) -> list[int]:
        """The ticket's pages: prefix-cache hits (retained) where the lookup finds them, new ones
        elsewhere. NOTE: _fits() counted every page as new, which holds: a hit on an evictable
        page takes it out of the available ones just as an allocation would."""
        found = self._alloc.lookup(t.lookup) if t.lookup else []
        found += [None] * (t.num_pages - len(found))
        t.hits = tuple(i for i, p in enumerate(found) if p is not None)
        fresh = iter(self._alloc.allocate(t.num_pages - len(t.hits)))
        return [p if p is not None else next(fresh) for p in found]

    def fail_all(self, err: Exception) -> None:
        for t in self._queue:
            _fail(t, err)
        self._queue.clear()
        self._pending.clear()
        self.waiting = 0


def _fail(ticket: AdmitTicket, err: Exception) -> None:
    if ticket.future.set_running_or_notify_cancel():
        ticket.future.set_exception(err)
