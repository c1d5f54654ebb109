"""ChainIndex: which store pages this worker knows, how deep each sits in its conversation, when it
was last used; and which should leave the store first (docs/design.md section 4, "tails before heads").

    priority(page) = last_use - depth * depth_weight_s        lowest priority leaves first

A conversation's pages form a hash chain: page 0 (the head) is reused by every later turn and by
every request sharing the prefix, page d only by requests that also match pages 0..d-1. So a page
one step deeper counts as used `depth_weight_s` earlier: an old chain loses its tail before its
head, and a chain resent every round keeps its head even when the store holds only part of it.
With depth_weight_s = 0 this is plain LRU (ties: deeper first).

Ended conversations leave first. The depth weight is seconds of age: a page 20 deep touched now
ranks with a head untouched for 20 minutes, so under churning traffic (conversations end, new ones
begin) the shallow pages of conversations that will never come back would outrank the live
conversations' tails for that long, and the store would fill with them (the hit rate decayed from
0.63 to 0.18 over a 30-minute soak). So the index learns how long a live conversation takes to come
back: each lookup from the head (touch with lookup=True) of a chain it knows is one sample, the
time since its deepest known page was last used. A page unused for more than STALE_AFTER_GAPS x the 90th
percentile of the recent samples is stale: stale pages are victims before any other, oldest first.
Before MIN_GAP_SAMPLES lookups (or with no multi-turn traffic) nothing is stale.

    chain A, touched at t=10:   A0 (10)  A1 (9)  A2 (8)  A3 (7)     (weight 1 s)
    chain B, touched at t=12:   B0 (12)  B1 (11) B2 (10)
    victims(3) -> A3, A2, A1 ... then A0 and B2 tie at 10: deeper first -> B2, A0

Structure: a dict key -> (priority, depth) and a min-heap of (priority, -depth, key) entries with
lazy deletion. A re-touch never lowers a key's priority (time only grows and depth only shrinks),
so an entry whose priority differs from the dict's is stale and simply dropped when popped.
touch() and forget() cost O(log N) per key, victims(n) O(n log N). Measured at 250k keys: touch
~2 us per key, victims(512) ~3.5 ms.

Stale entries pile up (one per re-touch). `compact()` rebuilds the heap from the live keys; the
rebuild (~100 ms at 250k keys) runs OUTSIDE the lock so a scheduler's touch never waits for it:
the evictor thread calls it every pass. Only if nobody does (the heap grows past 4x the live keys)
does touch() rebuild inline, under the lock.

Thread-safe: scheduler threads touch, the evictor thread reads victims and forgets removed keys.
Pure logic, no store access; the clock is injectable for tests.
"""

from __future__ import annotations

import collections
import heapq
import threading
import time
from collections.abc import Callable, Iterable, Sequence

# compact() rebuilds once the heap holds more than 2x the live keys (+ slack); touch() at 4x.
_COMPACT_SLACK = 1024
# Stale pages: unused for longer than this many times the p90 reuse gap of the last GAP_SAMPLES lookups.
# NOTE: the p90 (not the median) so that a burst of quick re-reads of a shared prefix does not make
# every live conversation look stale; 2 x leaves room for a slow turn (Poisson arrivals) and for rounds
# that grow longer as conversations do (the multi-turn benchmark's rounds grow ~1.4x a round).
STALE_AFTER_GAPS = 2.0
GAP_SAMPLES = 64
MIN_GAP_SAMPLES = 8


class ChainIndex:
    def __init__(self, max_pages: int, depth_weight_s: float, clock: Callable[[], float] = time.monotonic):
        if max_pages < 1:
            raise ValueError(f"max_pages must be >= 1, got {max_pages}")
        if depth_weight_s < 0:
            raise ValueError(f"depth_weight_s must be >= 0, got {depth_weight_s}")
        self.max_pages = max_pages
        self.depth_weight_s = depth_weight_s
        self._clock = clock
        self._lock = threading.Lock()
        self._pages: dict[str, tuple[float, int]] = {}  # key -> (priority, depth)
        self._heap: list[tuple[float, int, str]] = []  # (priority, -depth, key); may hold stale entries
        self._last_use: collections.OrderedDict[str, float] = collections.OrderedDict()  # oldest first
        self._gaps: collections.deque[float] = collections.deque(maxlen=GAP_SAMPLES)  # reuse gaps (s)
        self._pushed_during_rebuild: list[tuple[float, int, str]] | None = None  # set while compact() runs
        self.forgotten = 0  # keys dropped because the index was full (never removed from the store by us)

    def __len__(self) -> int:
        return len(self._pages)

    def touch(self, keys: Sequence[str], first_depth: int = 0, lookup: bool = False) -> None:
        """`keys` are consecutive pages of one chain, the first at depth `first_depth`: used now.

        `lookup`: a request looking its prompt up from the head (keys = its reusable pages). Its
        deepest page the index already knows was last used when the conversation was last here: the
        time since is one reuse-gap sample. NOTE: only lookups are samples. A write-back of page 0
        right after its own request's lookup is no conversation coming back; counted, such
        seconds-long gaps made every conversation look stale between rounds, and eviction LRU."""
        if first_depth < 0:
            raise ValueError(f"first_depth must be >= 0, got {first_depth}")
        with self._lock:
            now = self._clock()
            if lookup and first_depth == 0:
                known = next((k for k in reversed(keys) if k in self._last_use), None)
                if known is not None:
                    self._gaps.append(now - self._last_use[known])  # a conversation came back
            for i, key in enumerate(keys):
                depth = first_depth + i
                old = self._pages.get(key)
                if old is not None:
                    depth = min(depth, old[1])  # a page shared by two chains is as deep as its shallowest use
                self._set(key, now, depth)
            self._trim()
            if self._pushed_during_rebuild is None and len(self._heap) > 4 * len(self._pages) + _COMPACT_SLACK:
                self._heap = _heap_of(self._pages)

    def refresh(self, keys: Iterable[str]) -> None:
        """Known keys count as used now, at their recorded depth (unknown keys are ignored).

        NOTE: the evictor calls this for keys the store refused to remove because a reader holds a
        lease on them: they were just read, and without a refresh they would stay the lowest
        priority and be offered (and refused) again on every pass.
        """
        with self._lock:
            now = self._clock()
            for key in keys:
                old = self._pages.get(key)
                if old is not None:
                    self._set(key, now, old[1])

    def forget(self, keys: Iterable[str]) -> None:
        """Drop keys (removed from or no longer in the store); their heap entries go stale."""
        with self._lock:
            for key in keys:
                self._pages.pop(key, None)
                self._last_use.pop(key, None)

    def victims(self, n: int) -> list[str]:
        """The n first victims: stale keys (oldest first), then the lowest-priority keys. They stay in
        the index until forgotten."""
        with self._lock:
            stale = self._stale_keys(n)
            stale_set = set(stale)
            seen: set[str] = set()
            found: list[tuple[float, int, str]] = []  # live entries popped: pushed back below
            taken = 0
            while self._heap and len(stale) + taken < n:
                entry = heapq.heappop(self._heap)
                # NOTE: two touches at the same clock reading push equal entries; keep one.
                if self._live(entry) and entry[2] not in seen:
                    found.append(entry)
                    seen.add(entry[2])
                    taken += entry[2] not in stale_set  # already a victim as stale: not twice
            for entry in found:
                heapq.heappush(self._heap, entry)
            return stale + [key for _, _, key in found if key not in stale_set]

    def stale_after(self) -> float | None:
        """Seconds unused after which a page is stale; None until enough conversations came back."""
        with self._lock:
            return self._stale_after()

    def is_stale(self, key: str) -> bool:
        with self._lock:
            limit, last = self._stale_after(), self._last_use.get(key)
            return limit is not None and last is not None and self._clock() - last > limit

    def compact(self) -> bool:
        """Drop stale heap entries if they outnumber live keys; True if it rebuilt. Off the lock:
        entries pushed while it runs are replayed into the new heap; keys forgotten meanwhile are
        in it as stale entries, dropped when popped."""
        with self._lock:
            if self._pushed_during_rebuild is not None or len(self._heap) <= 2 * len(self._pages) + _COMPACT_SLACK:
                return False
            snapshot = self._pages.copy()
            self._pushed_during_rebuild = []
        heap = _heap_of(snapshot)
        with self._lock:
            for entry in self._pushed_during_rebuild:
                heapq.heappush(heap, entry)
            self._heap, self._pushed_during_rebuild = heap, None
        return True

    def priority(self, key: str) -> float | None:
        """A known key's priority (last use - depth x weight), None if unknown."""
        with self._lock:
            entry = self._pages.get(key)
        return None if entry is None else entry[0]

    def priority_now(self, depth: int) -> float:
        """The priority a page at `depth` touched now would have."""
        return self._clock() - depth * self.depth_weight_s

    def depth(self, key: str) -> int | None:
        """Recorded depth of a key, or None when unknown."""
        with self._lock:
            entry = self._pages.get(key)
            return entry[1] if entry is not None else None

    # ------------------------------------------------------------------ under the lock
    def _stale_after(self) -> float | None:
        if len(self._gaps) < MIN_GAP_SAMPLES:
            return None
        gaps = sorted(self._gaps)
        return STALE_AFTER_GAPS * gaps[int(0.9 * (len(gaps) - 1))]

    def _stale_keys(self, n: int) -> list[str]:
        """Up to n keys unused for longer than _stale_after(), oldest first."""
        limit = self._stale_after()
        if limit is None:
            return []
        oldest_allowed = self._clock() - limit
        stale: list[str] = []
        for key, last in self._last_use.items():  # oldest first: stop at the first fresh key
            if last >= oldest_allowed or len(stale) >= n:
                break
            stale.append(key)
        return stale

    def _set(self, key: str, now: float, depth: int) -> None:
        priority = now - depth * self.depth_weight_s
        self._pages[key] = (priority, depth)
        self._last_use[key] = now
        self._last_use.move_to_end(key)
        entry = (priority, -depth, key)
        heapq.heappush(self._heap, entry)
        if self._pushed_during_rebuild is not None:
            self._pushed_during_rebuild.append(entry)

    def _live(self, entry: tuple[float, int, str]) -> bool:
        priority, neg_depth, key = entry
        return self._pages.get(key) == (priority, -neg_depth)

    def _trim(self) -> None:
        while len(self._pages) > self.max_pages:
            entry = heapq.heappop(self._heap)
            if self._live(entry):
                del self._pages[entry[2]]
                self._last_use.pop(entry[2], None)
                self.forgotten += 1


def _heap_of(pages: dict[str, tuple[float, int]]) -> list[tuple[float, int, str]]:
    heap = [(prio, -depth, key) for key, (prio, depth) in pages.items()]
    heapq.heapify(heap)
    return heap
