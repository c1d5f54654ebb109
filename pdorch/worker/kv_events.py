"""KVEventJournal: what this worker's L1 and the store hold, as numbered batches for WatchKV subscribers.

    producers (any thread: the scheduler's allocator, store I/O threads, the chain evictor)
        l1_stored(hashes) l1_removed(hashes) l1_cleared() store_written(hashes) store_removed(hashes)
        inflight_claimed(hashes) inflight_released(hashes)   (prefill: pages a request is computing)
        -> a short lock: the mirrors (the L1 set, the store set) change, the first touch of a hash
           since the last cut remembers whether it was there then
    publisher thread, every CUT_INTERVAL_S
        cut(): the net change since the last cut -> EventBatch(seq + 1), or an empty one (seq + 1 too)
        after HEARTBEAT_S without changes or when the number of queued or running requests moved
        -> the ring of recent batches and every subscriber's queue
    subscribe(...) -> refusal text, or a Subscription: its initial batches (the batches after
        `after_seq` when the ring still holds them all, else one snapshot), then its queue

A batch is a NET change: a hash stored and removed again between two cuts is in neither list, and
one is never in both lists of one batch, so the order of applying them does not matter.

Bounds (docs/workers.md, "KV events"): the store mirror keeps the `store_max_pages` newest pages
(the older ones leave it as store_removed: the worker no longer claims them); the ring keeps
`ring_batches` batches and `ring_hashes` hashes; a subscriber's queue `queue_batches` batches, and a
subscriber whose queue is full is dropped (its stream ends; it resubscribes, resuming from the ring
or with a snapshot): never does a producer wait for a subscriber. Changes pending between two cuts
are bounded by `max_pending` hashes: past it (the publisher starved) they are given up, every
subscriber is dropped, and no resume from before that point is honoured (a snapshot then).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from pdorch.worker.kv_events_metrics import KVEventMetrics
from pdorch.worker.kv_subscription import EventBatch, Subscription
from store_client.page_hash import HASH_SCHEME, KV_LAYOUT_VERSION

if TYPE_CHECKING:  # status.py reads the proto stubs; the load's type is all this file needs
    from pdorch.worker.status import WorkerLoad

log = logging.getLogger(__name__)

CUT_INTERVAL_S = 0.05  # how often pending changes become a batch
HEARTBEAT_S = 1.0  # an empty batch after this long without changes: subscribers see the stream alive
QUEUE_BATCHES = 64  # per subscriber: ~3 s of batches under steady change
RING_BATCHES = 1024  # recent batches kept for resumes (~1 min of changes, ~17 min of heartbeats)
RING_HASHES = 1 << 18
MAX_PENDING = 1 << 18  # distinct hashes changed between two cuts
# Open subscriptions at most (each holds a gRPC thread: pdorch/worker/main.py sizes its pool with it);
# one per router replica is the use, so this is far above it.
MAX_SUBSCRIBERS = 64


class _TrackedSet:
    """A set of hashes (oldest first) that remembers, per hash touched since the last cut, whether it
    was in the set at that cut. With max_items, the oldest items leave it when it is full.

    NOTE: a plain dict, not an OrderedDict: a snapshot copies it under the lock, and list() of an
    OrderedDict of 262k keys takes ~70 ms (a dict's ~5 ms). Age order for the bound is kept apart:
    `_order` holds (hash, generation) as written; entries whose generation is no longer the hash's
    are skipped, and the deque is rebuilt when such entries outnumber the live ones."""

    def __init__(self, max_items: int | None = None):
        self.items: dict[str, int] = {}  # hash -> generation of its last add
        self.before: dict[str, bool] = {}
        self._max = max_items
        self._order: deque[tuple[str, int]] = deque()
        self._gen = 0

    def add(self, h: str) -> None:
        if h not in self.before:
            self.before[h] = h in self.items
        if self._max is None:
            self.items[h] = 0
            return
        self._gen += 1
        self.items.pop(h, None)  # re-inserted: newest in the dict's order too
        self.items[h] = self._gen
        self._order.append((h, self._gen))
        while len(self.items) > self._max:
            old, gen = self._order.popleft()
            if self.items.get(old) == gen:
                del self.items[old]
                self.before.setdefault(old, True)
        if len(self._order) > 2 * len(self.items) + 1024:
            self._order = deque(self.items.items())

    def discard(self, h: str) -> None:
        if h not in self.before:
            self.before[h] = h in self.items
        self.items.pop(h, None)

    def clear(self) -> None:
        for h in self.items:
            self.before.setdefault(h, True)
        self.items.clear()
        self._order.clear()

    def cut(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(added, removed) since the last cut, in the order first touched; starts a new interval."""
        items, before = self.items, self.before
        self.before = {}
        return (tuple(h for h, was in before.items() if not was and h in items),
                tuple(h for h, was in before.items() if was and h not in items))

    def copy(self) -> tuple[list[str], dict[str, bool]]:
        """(items, before) as they are: C-speed copies, so a snapshot holds the lock briefly."""
        return list(self.items), dict(self.before)


def state_at_cut(copy: tuple[list[str], dict[str, bool]]) -> tuple[str, ...]:
    """A _TrackedSet (its copy()) as it was at the last cut: what a snapshot with the last seq holds."""
    items, before = copy
    now = set(items)
    return (tuple(h for h in items if before.get(h, True))
            + tuple(h for h, was in before.items() if was and h not in now))


class KVEventJournal:
    """See the module docstring. `load_fn()` returns the worker's load (an object with free_pages,
    queued, running: pdorch.worker.status.WorkerLoad); it is called by the publisher, never under
    the journal's lock. Thread-safe; start() / stop(timeout_s) own the publisher thread."""

    def __init__(self, worker_id: str, page_size: int, load_fn: Callable[[], WorkerLoad], registry=None,
                 store_max_pages: int = 262144, layout_version: int = KV_LAYOUT_VERSION,
                 cut_interval_s: float = CUT_INTERVAL_S, heartbeat_s: float = HEARTBEAT_S,
                 queue_batches: int = QUEUE_BATCHES, ring_batches: int = RING_BATCHES,
                 ring_hashes: int = RING_HASHES, max_pending: int = MAX_PENDING,
                 max_subscribers: int = MAX_SUBSCRIBERS,
                 clock: Callable[[], float] = time.monotonic):
        self.worker_id = worker_id
        self.page_size = page_size
        self.layout_version = layout_version
        self.epoch = uuid.uuid4().hex  # a fresh one per process start: state of another epoch is gone
        self.cut_interval_s, self.heartbeat_s = cut_interval_s, heartbeat_s
        self.queue_batches, self.ring_batches, self.ring_hashes = queue_batches, ring_batches, ring_hashes
        self.max_pending, self.max_subscribers = max_pending, max_subscribers
        self._load_fn, self._clock = load_fn, clock
        self._lock = threading.Lock()
        self._l1 = _TrackedSet()
        self._store = _TrackedSet(store_max_pages)
        self._inflight = _TrackedSet()  # claims: pages a request here is computing (prefill_node/inflight.py)
        self._seq = 0  # the last batch published
        self._floor = 0  # resumes need after_seq >= this (raised when pending changes were given up)
        self._overflowed = False
        self._ring: deque[EventBatch] = deque()
        self._ring_hash_count = 0
        self._subs: list[Subscription] = []
        self._accepting = True
        self._last_cut = clock()
        self._last_load = (0, 0, 0)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.metrics = KVEventMetrics(registry, self)

    # ---------------------------------------------------------------------------- producers
    def l1_stored(self, hashes: Iterable[str]) -> None:
        self._change(self._l1.add, hashes)

    def l1_removed(self, hashes: Iterable[str]) -> None:
        self._change(self._l1.discard, hashes)

    def l1_cleared(self) -> None:
        with self._lock:
            self._l1.clear()
            self._check_pending()

    def store_written(self, hashes: Iterable[str]) -> None:
        self._change(self._store.add, hashes)

    def store_removed(self, hashes: Iterable[str]) -> None:
        self._change(self._store.discard, hashes)

    def inflight_claimed(self, hashes: Iterable[str]) -> None:
        self._change(self._inflight.add, hashes)

    def inflight_released(self, hashes: Iterable[str]) -> None:
        self._change(self._inflight.discard, hashes)

    def _change(self, op: Callable[[str], None], hashes: Iterable[str]) -> None:
        with self._lock:
            for h in hashes:
                op(h)
            self._check_pending()

    def _check_pending(self) -> None:
        """(lock held) Past max_pending the changes are given up: the mirrors stay exact, subscribers
        resync from a snapshot (see cut)."""
        if len(self._l1.before) + len(self._store.before) + len(self._inflight.before) > self.max_pending:
            self._l1.before.clear()
            self._store.before.clear()
            self._inflight.before.clear()
            self._overflowed = True

    # ---------------------------------------------------------------------------- publisher
    def start(self) -> KVEventJournal:
        if self._thread is not None:
            raise RuntimeError("KVEventJournal already started")
        self._thread = threading.Thread(target=self._loop, name="kv-events", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        """End every stream, stop the publisher and join it (bounded)."""
        self.end_streams()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("KV event publisher did not stop within %.1fs", timeout_s)

    def end_streams(self) -> None:
        """The worker stops: end every subscription ("stopped") and accept no more (their RPCs
        return, so the gRPC server's stop does not wait for them)."""
        with self._lock:
            self._accepting = False
            subs, self._subs = self._subs, []
        for sub in subs:
            sub._end("stopped")

    def _loop(self) -> None:
        while not self._stop.wait(self.cut_interval_s):
            try:
                self.cut()
            except Exception:  # a bug in one cut must not end the stream for good
                log.exception("KV event cut failed")

    def _load(self) -> tuple[int, int, int]:
        try:
            load = self._load_fn()
            return int(load.free_pages), int(load.queued), int(load.running)
        except Exception:  # the load numbers are advisory; the events are not
            log.exception("KV event load numbers")
            return self._last_load

    def cut(self, heartbeat: bool | None = None) -> EventBatch | None:
        """Publish the changes since the last cut as the next batch; with none, a heartbeat once
        heartbeat_s has passed or the request counts moved (heartbeat=True: now; False: never). The
        batch, or None."""
        load = self._load()
        now = self._clock()
        dropped: list[tuple[Subscription, str]] = []
        with self._lock:
            if self._overflowed:
                self._overflowed = False
                self._floor = self._seq + 1  # the changes given up lie between seq and seq + 1
                dropped += [(s, "overflow") for s in self._subs]
                self._subs = []
            l1_stored, l1_removed = self._l1.cut()
            store_written, store_removed = self._store.cut()
            claimed, released = self._inflight.cut()
            changed = bool(l1_stored or l1_removed or store_written or store_removed or claimed or released)
            # NOTE: a request started or ended is published at the next cut, not at the next heartbeat:
            # routers weigh the published load, and a finished request counted for up to a heartbeat
            # sent a new conversation to a busy worker (free_pages alone moves every page: not a cause)
            moved = load[1:] != self._last_load[1:]
            due = (now - self._last_cut >= self.heartbeat_s or moved) if heartbeat is None else heartbeat
            if not changed and not due:
                batch = None
            else:
                self._seq += 1
                self._last_cut, self._last_load = now, load
                batch = EventBatch(self.epoch, self._seq, False, l1_stored, l1_removed, store_written,
                                   store_removed, *load, inflight_claimed=claimed, inflight_released=released)
                self._hold(batch)
                slow = [s for s in self._subs if not s._offer(batch)]
                if slow:
                    self._subs = [s for s in self._subs if s not in slow]
                    dropped += [(s, "slow") for s in slow]
        for sub, reason in dropped:
            log.info("KV event subscriber %s dropped (%s)", sub.name, reason)
            self.metrics.dropped.labels(reason).inc()
            sub._end(reason)
        if batch is not None:
            self.metrics.published(batch)
        return batch

    def _hold(self, batch: EventBatch) -> None:
        """(lock held) Keep a batch for resumes, within the ring's bounds."""
        self._ring.append(batch)
        self._ring_hash_count += batch.num_hashes
        while self._ring and (len(self._ring) > self.ring_batches or self._ring_hash_count > self.ring_hashes):
            self._ring_hash_count -= self._ring.popleft().num_hashes

    # ---------------------------------------------------------------------------- subscribers
    def refusal(self, hash_scheme: str, page_size: int, layout_version: int) -> tuple[str, str] | None:
        """(field, text) when the subscriber's expectations differ from this worker's, else None."""
        for name, got, want in (("hash_scheme", hash_scheme, HASH_SCHEME), ("page_size", page_size, self.page_size),
                                ("layout_version", layout_version, self.layout_version)):
            if got != want:
                return name, (f"WatchKV refused: {name} {got!r} != this worker's {want!r} (worker {self.worker_id}; "
                              "the subscriber would read these page hashes wrong)")
        return None

    def subscribe(self, hash_scheme: str, page_size: int, layout_version: int, epoch: str = "",
                  after_seq: int = 0, subscriber: str = "") -> Subscription | str:
        """The refusal text (it names the field and both values), or a Subscription: the batches after
        after_seq when `epoch` is this one and the ring holds them all, else a snapshot; then every
        batch published after them, in its queue. Once the worker stops, or with max_subscribers open:
        a subscription already ended ("stopped", "full")."""
        refused = self.refusal(hash_scheme, page_size, layout_version)
        if refused is not None:
            self.metrics.refused.labels(refused[0]).inc()
            return refused[1]
        sub = Subscription(subscriber or "?", self.queue_batches)
        with self._lock:
            full = len(self._subs) >= self.max_subscribers
            if full or not self._accepting:
                sub._end("full" if full and self._accepting else "stopped")
                return sub
            resume = self._resumable(epoch, after_seq)
            if resume:
                sub.initial = [b for b in self._ring if b.seq > after_seq]
            else:
                l1, store, seq, load = self._l1.copy(), self._store.copy(), self._seq, self._last_load
                claims = self._inflight.copy()
            self._subs.append(sub)
        kind = "resume" if resume else "snapshot"
        if not resume:  # built outside the lock: producers wait only for the copies
            sub.initial = [EventBatch(self.epoch, seq, True, l1_stored=state_at_cut(l1),
                                      store_written=state_at_cut(store), free_pages=load[0], queued=load[1],
                                      running=load[2], inflight_claimed=state_at_cut(claims))]
        (self.metrics.resumes if kind == "resume" else self.metrics.snapshots).inc()
        log.info("KV event subscriber %s: %s from seq %d (epoch %s)", sub.name, kind,
                 sub.initial[0].seq if sub.initial else self._seq + 1, self.epoch[:8])
        return sub

    def _resumable(self, epoch: str, after_seq: int) -> bool:
        """(lock held) Whether every batch after after_seq is still held (none missing, none given up)."""
        if epoch != self.epoch or not self._floor <= after_seq <= self._seq:
            return False
        return after_seq == self._seq or (bool(self._ring) and self._ring[0].seq <= after_seq + 1)

    def unsubscribe(self, sub: Subscription) -> None:
        """The subscriber went away (its RPC ended)."""
        with self._lock:
            if sub in self._subs:
                self._subs.remove(sub)
        sub._end("unsubscribed")

    # ---------------------------------------------------------------------------- numbers
    @property
    def seq(self) -> int:
        return self._seq

    def num_subscribers(self) -> int:
        return len(self._subs)

    def num_held(self) -> tuple[int, int]:
        """(batches, hashes) the ring holds."""
        return len(self._ring), self._ring_hash_count

    def num_pages(self) -> tuple[int, int]:
        """(L1 hashes, store hashes) in the mirrors."""
        return len(self._l1.items), len(self._store.items)


def hashes_of(keys: Iterable[str]) -> list[str]:
    """Page hashes of store keys ("fingerprint/hash", store_client/page_hash.py store_key)."""
    return [k.rpartition("/")[2] for k in keys]


def worker_journal(rt, store_index_pages: int, worker_id: str, load_fn: Callable[[], WorkerLoad], registry,
                   store_evicted: Callable[[list[str]], None],
                   store_lost: Callable[[list[str]], None] | None = None) -> KVEventJournal:
    """A worker's journal, fed from its runtime and started: its allocator (L1), the store writes of
    its I/O threads, its chain evictor's removals (which also go to `store_evicted`, the scheduler's)
    and the pages a master leader switch lost (to `store_lost`, else `store_evicted`).
    The store mirror is as bounded as the chain index (`store_index_pages`: store.evict_index_pages)."""
    journal = KVEventJournal(worker_id, rt.page_size, load_fn, registry, store_max_pages=store_index_pages)
    rt.allocator.listener = journal
    if rt.store_io is not None:
        rt.store_io.on_saved = lambda keys: journal.store_written(hashes_of(keys))
    if rt.evictor is not None:
        def removed(keys) -> None:
            store_evicted(keys)
            journal.store_removed(hashes_of(keys))
        rt.evictor.on_removed = removed
    if rt.store is not None:
        def lost(keys) -> None:
            (store_lost or store_evicted)(keys)
            journal.store_removed(hashes_of(keys))
        rt.store.on_lost = lost
    return journal.start()
