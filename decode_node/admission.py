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

In-flight sharing (`decode.share_inflight_prefix`): an admitted request CLAIMS the reusable prompt
pages its lookup missed (P or D's own forward is filling them now) until they are in the prefix
cache (`filled`: its prompt is in place) or it ends. A ticket whose lookup meets another request's
claims waits for them (still admitting the tickets behind it), then is admitted with those pages as
prefix-cache hits: identical prompts arriving together are pushed from P (or computed) once, and a
duplicate's whole prompt but its last page is shared in the pool. Its hits among the pages it waited
for are counted (`AdmitTicket.shared`) and reported as cached tier `inflight`.

One owner of a request's admission, which the scheduler calls once per message about it:

    Admit    admit(ticket)   queued, and answered at once when it fits (prefix-cache hits counted)
    Join     joined(req)     its growth is the batch's now; with nothing left to compute here its
                             prompt is in place: its pages go to the prefix cache and its claims end
    Release  ended(rid)      it failed before joining: its growth and claims end

and `admit_ready()` once per iteration, answering the tickets that waited. The decode step calls
`in_place(req)` when it computed a prompt itself.

NOTE: runs on the decode scheduler thread only, which owns the allocator (the one concurrency
rule of both workers, pdorch/worker/loop.py). A handler thread posts an AdmitTicket and waits for
its future (DecodeScheduler.admit).
"""

from __future__ import annotations

import collections
import concurrent.futures
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from decode_node.growth import GrowthReserve
from pdorch.worker.errors import Aborted, DeadlineExceeded, InvalidRequest, Overloaded

if TYPE_CHECKING:
    from decode_node.prefix_cache import DecodePrefixCache
    from decode_node.request import DecodeRequest

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
    waited: frozenset[str] = frozenset()  # hashes it waited for (other requests' claims)
    shared: int = 0  # set before the future: of `hits`, the pages it waited for


class Admitted(NamedTuple):
    """A prompt's admission: its page ids, the indexes found in the prefix cache, and how many of those
    it waited for while another request filled them (tier `inflight`)."""

    pages: list[int]
    hits: tuple[int, ...]
    shared: int


class Admission:
    def __init__(self, allocator, max_queued: int, watermark: float, reserve: GrowthReserve | None = None,
                 share_inflight: bool = False, metrics: InFlightWaits | None = None,
                 cache: DecodePrefixCache | None = None):
        """`reserve`: the fraction of the admitted requests' growth kept back (None: nothing);
        `share_inflight`: wait for the pages another admitted request is filling (module docstring);
        `cache`: the decode worker's prefix cache (None or off: no lookup, nothing cached here)."""
        self._alloc = allocator
        self._cache = cache
        self._share = share_inflight
        self._metrics = metrics
        self._claims: dict[str, tuple[str, ...]] = {}  # request id -> the hashes it fills
        self._filler: dict[str, str] = {}  # hash -> the request filling it
        self._max_queued = max_queued
        self._watermark = watermark
        self._reserve = reserve
        self._queue: collections.deque[AdmitTicket] = collections.deque()
        # Admitted, not yet in the batch (P is prefilling them): request id -> (growth, deadline).
        # NOTE: counted here until Join or failure (settled()); the scheduler counts them after.
        self._pending: dict[str, tuple[int, float]] = {}
        self.waiting = 0  # tickets queued; other threads read it as a snapshot (load figures)

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

    def admit(self, ticket: AdmitTicket, now: float, wake_at: Callable[[float], None], growth: int = 0,
              hold: bool = False) -> None:
        """An Admit message: `ticket` queued (or rejected at once), then answered with the tickets
        queued before it when they fit (admit_ready's arguments)."""
        self.offer(ticket)
        self.admit_ready(now, wake_at, growth, hold)

    def joined(self, req: DecodeRequest) -> None:
        """A Join message: `req`'s growth is counted by the batch from now on; with nothing left to
        compute here its prompt is in place (in_place)."""
        self.settled(req.request_id)
        if not req.compute.todo:
            self.in_place(req)

    def in_place(self, req: DecodeRequest) -> None:
        """Every prompt page's KV is in `req`'s pages: the full ones go to the prefix cache and its
        claims end (the requests that waited for them take them from there)."""
        if self._cache is not None:
            self._cache.prompt_in_place(req)
        self.filled(req.request_id)

    def ended(self, request_id: str) -> None:
        """The request ended before its prompt was in place (a Release before joining, or in the batch
        while computing its prompt): its growth and its claims end."""
        self.settled(request_id)
        self.filled(request_id)

    def settled(self, request_id: str) -> None:
        """An admitted request joined the batch or failed: its growth is no longer counted here."""
        self._pending.pop(request_id, None)

    def filled(self, request_id: str) -> None:
        """The request's prompt is in place (its pages cached), or it ended: its claims end."""
        for h in self._claims.pop(request_id, ()):
            if self._filler.get(h) == request_id:
                del self._filler[h]

    def _claim(self, t: AdmitTicket, found: list) -> None:
        if not self._share:
            return
        mine = tuple(h for h, page in zip(t.lookup, found) if page is None and h not in self._filler)
        if mine:
            self._claims[t.request_id] = mine
            self._filler.update(dict.fromkeys(mine, t.request_id))

    def _waits_for(self, t: AdmitTicket) -> frozenset[str]:
        """The ticket's pages another admitted request is filling now."""
        if not self._filler:
            return frozenset()
        return frozenset(h for h in t.lookup if self._filler.get(h, t.request_id) != t.request_id)

    def offer(self, ticket: AdmitTicket) -> None:
        """Queue a ticket, or reject it at once: larger than the whole pool (it could never be admitted),
        or the wait queue is full and it does not fit."""
        if ticket.num_pages > self._alloc.num_total:
            _fail(ticket, InvalidRequest(f"request {ticket.request_id} needs {ticket.num_pages} KV pages; the pool "
                                         f"has {self._alloc.num_total} (decode.num_pages)"))
            return
        if self._cache is None or not self._cache.enabled:
            ticket.lookup = ()  # no prefix cache to look the pages up in
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
            self.filled(rid)
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
            elif self._share and t.lookup and (waits := self._waits_for(t)):
                t.waited |= waits  # another request is filling these pages: take them from the cache
                keep.append(t)
                wake_at(t.deadline)
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
        self._claim(t, found)
        found += [None] * (t.num_pages - len(found))
        t.hits = tuple(i for i, p in enumerate(found) if p is not None)
        if self._cache is not None:
            self._cache.hits.inc(len(t.hits))
        if t.waited:
            t.shared = sum(1 for i in t.hits if t.lookup[i] in t.waited)
            if self._metrics is not None:
                self._metrics.count(t.shared)
        fresh = iter(self._alloc.allocate(t.num_pages - len(t.hits)))
        return [p if p is not None else next(fresh) for p in found]

    def fail_all(self, err: Exception) -> None:
        for t in self._queue:
            _fail(t, err)
        self._queue.clear()
        self._pending.clear()
        self._claims.clear()
        self._filler.clear()
        self.waiting = 0


class InFlightWaits:
    """pdorch_decode_inflight_*: requests that waited for pages another request was filling."""

    def __init__(self, registry):
        from prometheus_client import Counter

        self.waits = Counter("pdorch_decode_inflight_waits", "Requests that waited for prompt pages another request "
                             "on this decode worker was filling, by how it ended (shared: the pages were cached; "
                             "owner_gone: none was, its owner ended without them)", ["outcome"], registry=registry)
        for outcome in ("shared", "owner_gone"):
            self.waits.labels(outcome)
        self.pages = Counter("pdorch_decode_inflight_pages", "Prompt pages shared from another request's in-flight "
                             "prefill instead of being pushed (or computed) again", registry=registry)

    def count(self, shared: int) -> None:
        self.waits.labels("shared" if shared else "owner_gone").inc()
        self.pages.inc(shared)


def _fail(ticket: AdmitTicket, err: Exception) -> None:
    if ticket.future.set_running_or_notify_cancel():
        ticket.future.set_exception(err)
