"""PageAllocator: ref-counted KV pages plus the L1 prefix cache (hash -> page) with LRU eviction.

Every page is in exactly one state:

    free       ref 0, no hash    -> in `_free` (FIFO)
    evictable  ref 0, has hash   -> in `_evictable` (LRU first), still matchable by its hash
    used       ref > 0           -> held by sequences (may or may not have a hash)

Allocation order ("eviction order"): all free pages first, then evictable pages least recently
released first. `check_integrity()` asserts the partition and the two hash maps agree.
"""

from __future__ import annotations

from collections import OrderedDict, deque


class OutOfPages(RuntimeError):
    """Not enough free or evictable pages for an allocation."""


class PageAllocator:
    def __init__(self, num_pages: int):
        if num_pages < 1:
            raise ValueError(f"num_pages must be >= 1, got {num_pages}")
        self.num_total = num_pages
        self._ref = [0] * num_pages
        self._free: deque[int] = deque(range(num_pages))
        self._evictable: OrderedDict[int, str] = OrderedDict()  # page -> hash, LRU first
        self._hash_to_page: dict[str, int] = {}
        self._page_to_hash: dict[int, str] = {}
        self.num_evicted = 0  # cached pages reclaimed by allocate(), for metrics

    # -- queries -----------------------------------------------------------------------------
    def num_available(self) -> int:
        return len(self._free) + len(self._evictable)

    def num_free(self) -> int:
        return len(self._free)

    def num_cached(self) -> int:
        return len(self._hash_to_page)

    def ref_count(self, page_id: int) -> int:
        return self._ref[page_id]

    def page_hash(self, page_id: int) -> str | None:
        return self._page_to_hash.get(page_id)

    def eviction_order(self) -> list[int]:
        """The pages allocate() would hand out next, in order."""
        return list(self._free) + list(self._evictable)

    # -- operations --------------------------------------------------------------------------
    def allocate(self, n: int) -> list[int]:
        """n pages with ref 1: free pages first, then least recently used cached pages."""
        if n < 0:
            raise ValueError(f"cannot allocate {n} pages")
        if n > self.num_available():
            raise OutOfPages(f"need {n} KV pages, only {self.num_available()} of {self.num_total} available")
        out = []
        for _ in range(n):
            if self._free:
                page = self._free.popleft()
            else:
                page, h = self._evictable.popitem(last=False)
                del self._hash_to_page[h], self._page_to_hash[page]
                self.num_evicted += 1
            self._ref[page] = 1
            out.append(page)
        return out

    def retain(self, page_ids) -> None:
        for page in page_ids:
            if self._ref[page] == 0:
                if page not in self._evictable:
                    raise ValueError(f"retain of free page {page}")
                del self._evictable[page]
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
                    self._free.append(page)
                else:
                    self._evictable[page] = h

    def match_prefix(self, page_hashes) -> list[int]:
        """Pages of the leading `page_hashes` present in the cache, retained for the caller."""
        out = []
        for h in page_hashes:
            page = self._hash_to_page.get(h)
            if page is None:
                break
            out.append(page)
        self.retain(out)
        return out

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
        return page_id

    def flush(self) -> int:
        """Forget every cached hash; evictable pages become free. Returns the entries dropped."""
        dropped = len(self._hash_to_page)
        self._free.extend(self._evictable)
        self._evictable.clear()
        self._hash_to_page.clear()
        self._page_to_hash.clear()
        return dropped

    def check_integrity(self) -> None:
        """Raise AssertionError unless free + evictable + used == total and the maps agree."""
        free, evictable = set(self._free), set(self._evictable)
        used = {p for p in range(self.num_total) if self._ref[p] > 0}
        assert len(free) == len(self._free), f"duplicate page in free list: {list(self._free)}"
        assert not (free & evictable) and not (free & used) and not (evictable & used), "page in two states"
        assert len(free) + len(evictable) + len(used) == self.num_total, (
            f"free {len(free)} + evictable {len(evictable)} + used {len(used)} != total {self.num_total}")
        assert all(r >= 0 for r in self._ref), "negative ref count"
        assert all(p not in self._page_to_hash for p in free), "free page still has a hash"
        assert all(self._page_to_hash.get(p) == h for p, h in self._evictable.items()), "evictable hash mismatch"
        assert len(self._hash_to_page) == len(self._page_to_hash), "hash maps differ in size"
        assert all(self._page_to_hash[p] == h for h, p in self._hash_to_page.items()), "hash maps disagree"
