"""PageAllocator: ref-counted KV pages plus the L1 prefix cache (hash -> page) with LRU eviction.

Every page is in exactly one state:

    free       ref 0, no hash    -> in `_free` (ascending page ids: allocate() hands out runs)
    evictable  ref 0, has hash   -> in `_evictable_persisted`, `_evictable_unwritten`,
                                    `_evictable_dropped` or `_evictable` (LRU first), still matchable
                                    by its hash
    used       ref > 0           -> held by sequences (may or may not have a hash)

A cached page is *persisted* once the store is known to hold it (written, skipped as present, or
loaded from it). Allocation order ("eviction order"): free pages first, then persisted evictable
pages (the store can give them back), then pages the write policy has not written yet
(UNWRITTEN: `store.write_policy: write_through_selective` writes a page only at its N-th use,
`uses()`), then pages the store's eviction dropped on purpose (LEFT_STORE: kept so L1 holds what
the store lacks; newest first, see allocate()), then other unpersisted ones; the others least
recently released first. So a page leaves L1 without being in the store only when nothing else is
left, and every such loss is counted by its reason (`evicted_unpersisted`): "no self-made holes"
(docs/design.md section 4).
`check_integrity()` asserts the partition and that the hash maps agree.

Ended conversations leave first: with `stale_after` set (by the owner, from the chain index's learned
reuse gap: store_client/chain_index.py), a cached page evictable for longer than that is handed out
before every other tier, oldest first, whatever the store holds. NOTE: without it, under traffic
where conversations end and new ones begin, the dropped tier (newest first) keeps the pages of
conversations that never come back and gives up those of the live ones.

Free pages go out as contiguous runs where the pool has them (first fit, else the lowest ids): one
page-first run is one block of memory, so a P->D push or a store read of it is one transfer
(store_client/transfer.py merges pages contiguous on both sides).
"""

from __future__ import annotations

import bisect
import time
from collections import Counter, OrderedDict
from collections.abc import Callable

UNKNOWN = "not_written"  # the reason of an unpersisted page nobody tried to write (e.g. write-back off)
LEFT_STORE = "store_evicted"  # the store's (chain) eviction removed it: a loss by policy, not by accident
UNWRITTEN = "selective"  # the write policy writes it only once it is used more: a loss by policy too
PENDING = "pending"  # a write of the page is queued or running (either worker's)


def pages_for(num_tokens: int, page_size: int) -> int:
    """Pages that hold `num_tokens` tokens (the last one may be partial): ceil(num_tokens / page_size).
    The one place this is written; the prompt-level rules (which pages are reusable, what is left to
    compute) build on it in pdorch/worker/prompt_pages.py."""
    return -(-num_tokens // page_size)


class OutOfPages(RuntimeError):
    """Not enough free or evictable pages for an allocation."""


class PageAllocator:
    def __init__(self, num_pages: int, clock: Callable[[], float] = time.monotonic):
        if num_pages < 1:
            raise ValueError(f"num_pages must be >= 1, got {num_pages}")
        self.num_total = num_pages
        self._ref = [0] * num_pages
        self._free: list[int] = list(range(num_pages))  # ascending
        self._evictable: OrderedDict[int, str] = OrderedDict()  # unpersisted: page -> hash, LRU first
        self._evictable_persisted: OrderedDict[int, str] = OrderedDict()  # in the store too
        self._evictable_dropped: OrderedDict[int, str] = OrderedDict()  # removed by the store's eviction
        self._evictable_unwritten: OrderedDict[int, str] = OrderedDict()  # not written yet by policy
        self._uses: dict[int, int] = {}  # cached page -> times used: 1 when cached, +1 per lookup hit
        self._hash_to_page: dict[str, int] = {}
        self._page_to_hash: dict[int, str] = {}
        self._persisted: set[int] = set()  # cached pages the store holds
        self._unpersisted_reason: dict[int, str] = {}  # cached pages whose write failed or was dropped
        self._clock = clock
        self._released_at: dict[int, float] = {}  # evictable page -> when it last became evictable
        self.stale_after: float | None = None  # seconds evictable after which a page goes first; None = never
        self.num_evicted = 0  # cached pages reclaimed by allocate(), for metrics
        self.evicted_unpersisted: Counter[str] = Counter()  # cached pages lost from L1 and store, by reason
        # Told what enters and leaves the cache (pdorch/worker/kv_events.py): l1_stored(hashes) for a new
        # hash, l1_removed(hashes) for pages allocate() took back, l1_cleared() on flush. None: off.
        self.listener = None

    # -- queries -----------------------------------------------------------------------------
    def num_available(self) -> int:
        return len(self._free) + len(self._evictable) + self._num_evictable_without_loss()

    def num_available_without_loss(self) -> int:
        """Pages allocate() can hand out without dropping a page the store lacks."""
        return len(self._free) + self._num_evictable_without_loss()

    def _num_evictable_without_loss(self) -> int:
        return len(self._evictable_persisted) + len(self._evictable_unwritten) + len(self._evictable_dropped)

    def uses(self, page_id: int) -> int:
        """How often a cached page was used: 1 for caching it (computed, loaded), +1 per lookup hit."""
        return self._uses.get(page_id, 0)

    def num_unpersisted(self) -> int:
        """Cached pages the store is not known to hold."""
        return len(self._hash_to_page) - len(self._persisted)

    def is_persisted(self, page_id: int) -> bool:
        return page_id in self._persisted

    def unpersisted_reason(self, page_id: int) -> str | None:
        """Why a cached, unpersisted page is not in the store (None: persisted, uncached or pending)."""
        return self._unpersisted_reason.get(page_id)

    def num_free(self) -> int:
        return len(self._free)

    def num_cached(self) -> int:
        return len(self._hash_to_page)

    def ref_count(self, page_id: int) -> int:
        return self._ref[page_id]

    def page_hash(self, page_id: int) -> str | None:
        return self._page_to_hash.get(page_id)

    def eviction_order(self) -> list[int]:
        """The pages allocate() would hand out next, in order (stale pages: see _victim_tier)."""
        tiers = (list(self._evictable_persisted) + list(self._evictable_unwritten)
                 + list(reversed(self._evictable_dropped)) + list(self._evictable))
        limit = self._stale_limit()
        stale = sorted((p for p in tiers if limit is not None and self._released_at[p] < limit),
                       key=self._released_at.__getitem__)
        return list(self._free) + stale + [p for p in tiers if p not in set(stale)]

    def unstored_pages(self) -> list[int]:
        """Every cached page the store lacks but those it dropped on purpose (LEFT_STORE), whatever the
        write policy held back and whether in use or not: what a draining worker writes back."""
        return [p for p in self._page_to_hash
                if p not in self._persisted and self._unpersisted_reason.get(p) != LEFT_STORE]

    def lru_unpersisted(self, n: int) -> list[int]:
        """Up to n unpersisted evictable pages, the ones allocate() would drop first."""
        out = []
        for page in self._evictable:
            if len(out) >= n:
                break
            out.append(page)
        return out

    # -- operations --------------------------------------------------------------------------
    def allocate(self, n: int) -> list[int]:
        """n pages with ref 1: free pages first, then least recently used cached pages."""
        if n < 0:
            raise ValueError(f"cannot allocate {n} pages")
        if n > self.num_available():
            raise OutOfPages(f"need {n} KV pages, only {self.num_available()} of {self.num_total} available")
        out = self._take_free(min(n, len(self._free)))
        for page in out:
            self._ref[page] = 1
        evicted = [] if self.listener is not None and n > len(out) else None
        for _ in range(n - len(out)):
            lru, newest = self._victim_tier()
            page, h = lru.popitem(last=newest)
            del self._released_at[page]
            if lru is self._evictable_persisted:
                self._persisted.discard(page)
            else:
                self.evicted_unpersisted[self._unpersisted_reason.pop(page, UNKNOWN)] += 1
            del self._hash_to_page[h], self._page_to_hash[page], self._uses[page]
            self.num_evicted += 1
            self._ref[page] = 1
            out.append(page)
            if evicted is not None:
                evicted.append(h)
        if evicted:
            self.listener.l1_removed(evicted)
        return out

    def retain(self, page_ids) -> None:
        for page in page_ids:
            if self._ref[page] == 0:
                lru = self._lru_holding(page)
                if lru is None:
                    raise ValueError(f"retain of free page {page}")
                del lru[page]
                del self._released_at[page]
            self._ref[page] += 1

    def release(self, page_ids) -> None:
        """ref -1 each; at 0 a cached page becomes evictable, an uncached one free.

        NOTE: released tail-first, so a sequence's last pages sit nearer the LRU end than its
        first ones: a shared prefix chain is evicted from its tail, never from its root (a chain
        without its root page can never match again).
        """
        for page in reversed(list(page_ids)):
            if self._ref[page] <= 0:
                raise ValueError(f"release of page {page} whose ref count is already 0")
            self._ref[page] -= 1
            if self._ref[page] == 0:
                h = self._page_to_hash.get(page)
                if h is None:
                    bisect.insort(self._free, page)
                else:
                    self._lru_for(page)[page] = h
                    self._released_at[page] = self._clock()

    def match_prefix(self, page_hashes) -> list[int]:
        """Pages of the leading `page_hashes` present in the cache, retained for the caller."""
        out = []
        for h in page_hashes:
            page = self._hash_to_page.get(h)
            if page is None:
                break
            out.append(page)
        self._hit(out)
        return out

    def lookup(self, page_hashes) -> list[int | None]:
        """For each hash, its cached page (retained for the caller) or None: gaps do not stop the
        match, because a chained hash names its whole prefix (a page after a gap is still valid)."""
        out = [self._hash_to_page.get(h) for h in page_hashes]
        self._hit([p for p in out if p is not None])
        return out

    def _hit(self, pages: list[int]) -> None:
        """Pages a lookup found: retained for the caller, one more use each."""
        self.retain(pages)
        for page in pages:
            self._uses[page] += 1

    def mark_persisted(self, page_ids) -> None:
        """The store now holds these pages (cached ones; others are ignored)."""
        for page in page_ids:
            h = self._page_to_hash.get(page)
            if h is None or page in self._persisted:
                continue
            self._persisted.add(page)
            self._unpersisted_reason.pop(page, None)
            self._refile(page)

    def pages_of(self, page_hashes) -> list[int]:
        """The cached pages holding these hashes (unknown hashes are skipped)."""
        return [p for p in (self._hash_to_page.get(h) for h in page_hashes) if p is not None]

    def mark_left_store(self, page_ids, reason: str) -> None:
        """The store no longer holds these cached pages (evicted from it): they become unpersisted,
        so L1 now keeps them after the pages the store still holds."""
        for page in page_ids:
            h = self._page_to_hash.get(page)
            if h is None:
                continue
            self._persisted.discard(page)
            self._unpersisted_reason[page] = reason
            self._refile(page)

    def mark_unpersisted(self, page_ids, reason: str) -> None:
        """Writing these cached pages to the store failed or was dropped, for `reason`."""
        for page in page_ids:
            if page in self._page_to_hash and page not in self._persisted:
                self._unpersisted_reason[page] = reason
                self._refile(page)

    def cache(self, page_hash: str, page_id: int) -> int:
        """Register a fully written, referenced page under its hash; returns the page holding it.

        An existing hash keeps its page (the caller's page stays uncached and is freed normally).
        """
        if self._ref[page_id] <= 0:
            raise ValueError(f"cache() of page {page_id} that nobody holds")
        existing = self._hash_to_page.get(page_hash)
        if existing is not None:
            return existing
        old = self._page_to_hash.get(page_id)
        if old is not None:
            raise ValueError(f"page {page_id} is already cached under another hash {old[:12]}")
        self._hash_to_page[page_hash] = page_id
        self._page_to_hash[page_id] = page_hash
        self._uses[page_id] = 1
        if self.listener is not None:
            self.listener.l1_stored((page_hash,))
        return page_id

    def flush(self) -> int:
        """Forget every cached hash; evictable pages become free. Returns the entries dropped.

        Unpersisted pages dropped here count under reason "flush" (an operator's choice).
        """
        dropped = len(self._hash_to_page)
        self.evicted_unpersisted["flush"] += self.num_unpersisted()
        for lru in self._tiers():
            self._free.extend(lru)
            lru.clear()
        self._free.sort()
        self._released_at.clear()
        self._hash_to_page.clear()
        self._page_to_hash.clear()
        self._uses.clear()
        self._persisted.clear()
        self._unpersisted_reason.clear()
        if self.listener is not None:
            self.listener.l1_cleared()
        return dropped

    def check_integrity(self) -> None:
        """Raise AssertionError unless free + evictable + used == total and the maps agree."""
        free = set(self._free)
        assert sum(map(len, self._tiers())) == len(set().union(*self._tiers())), "page evictable twice"
        assert all(self._lru_for(p) is lru for lru in self._tiers() for p in lru), "page in the wrong LRU"
        assert set(self._uses) == set(self._page_to_hash), "use counts of pages that are not cached"
        assert self._persisted <= set(self._page_to_hash), "persisted page without a hash"
        assert set(self._unpersisted_reason) <= set(self._page_to_hash) - self._persisted, "stale reason"
        evictable = set().union(*self._tiers())
        assert set(self._released_at) == evictable, "release times of pages that are not evictable"
        used = {p for p in range(self.num_total) if self._ref[p] > 0}
        assert len(free) == len(self._free), f"duplicate page in free list: {list(self._free)}"
        assert not (free & evictable) and not (free & used) and not (evictable & used), "page in two states"
        assert len(free) + len(evictable) + len(used) == self.num_total, (
            f"free {len(free)} + evictable {len(evictable)} + used {len(used)} != total {self.num_total}")
        assert all(r >= 0 for r in self._ref), "negative ref count"
        assert all(p not in self._page_to_hash for p in free), "free page still has a hash"
        assert all(self._page_to_hash.get(p) == h for d in self._tiers() for p, h in d.items()), \
            "evictable hash mismatch"

    # -- helpers ------------------------------------------------------------------------------
    def _stale_limit(self) -> float | None:
        return None if self.stale_after is None else self._clock() - self.stale_after

    def _victim_tier(self) -> tuple[OrderedDict, bool]:
        """The tier the next evicted page comes from, and whether from its newest end.

        Stale pages first (the tier whose oldest page is the oldest and stale), then persisted
        pages, then pages the write policy has not written yet (used fewer times than it asks), then
        pages the store dropped, then the other unpersisted ones.
        NOTE: the dropped tier gives up its NEWEST page first (MRU): conversations come back
        round-robin, and LRU would evict exactly the pages asked for next, while keeping the
        oldest ones gives the same conversations a hit every round (stale ones aside).
        """
        limit = self._stale_limit()
        if limit is not None:
            heads = [(self._released_at[next(iter(lru))], i) for i, lru in enumerate(self._tiers()) if lru]
            oldest = min(heads, default=None)
            if oldest is not None and oldest[0] < limit:
                return self._tiers()[oldest[1]], False
        if self._evictable_persisted:
            return self._evictable_persisted, False
        if self._evictable_unwritten:
            return self._evictable_unwritten, False
        if self._evictable_dropped:
            return self._evictable_dropped, True
        return self._evictable, False

    def _tiers(self) -> tuple[OrderedDict, OrderedDict, OrderedDict, OrderedDict]:
        return self._evictable_persisted, self._evictable_unwritten, self._evictable_dropped, self._evictable

    def _take_free(self, n: int) -> list[int]:
        """n free pages: the first contiguous run that holds them all, else the n lowest ids.

            free  [2, 3, 7, 8, 9, 12]   n=3 -> [7, 8, 9]    n=4 -> [2, 3, 7, 8]
        """
        free = self._free
        if n == 0:
            return []
        start = 0
        for i in range(1, len(free) + 1):
            if i == len(free) or free[i] != free[i - 1] + 1:  # a run free[start:i] ends here
                if i - start >= n:
                    break
                start = i
        else:  # no run is long enough
            start = 0
        out = free[start:start + n]
        del free[start:start + n]
        return out

    def _lru_for(self, page: int) -> OrderedDict:
        """The evictable LRU a cached page belongs in, by its persistence state."""
        if page in self._persisted:
            return self._evictable_persisted
        reason = self._unpersisted_reason.get(page)
        if reason == LEFT_STORE:
            return self._evictable_dropped
        if reason == UNWRITTEN:
            return self._evictable_unwritten
        return self._evictable

    def _lru_holding(self, page: int) -> OrderedDict | None:
        for lru in self._tiers():
            if page in lru:
                return lru
        return None

    def _refile(self, page: int) -> None:
        """Move an evictable page to the LRU its (changed) state calls for."""
        lru = self._lru_holding(page)
        if lru is not None and lru is not self._lru_for(page):
            self._lru_for(page)[page] = lru.pop(page)
        assert len(self._hash_to_page) == len(self._page_to_hash), "hash maps differ in size"
        assert all(self._page_to_hash[p] == h for h, p in self._hash_to_page.items()), "hash maps disagree"
