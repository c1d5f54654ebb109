"""PageAllocator: exact page ids, ref counts and eviction order; integrity after every scenario."""

import pytest

from engine.page_allocator import LEFT_STORE, UNWRITTEN, OutOfPages, PageAllocator


@pytest.fixture
def alloc():
    a = PageAllocator(6)
    yield a
    a.check_integrity()


def test_allocate_hands_out_free_pages_in_order(alloc):
    assert alloc.allocate(2) == [0, 1]
    assert alloc.allocate(3) == [2, 3, 4]
    assert [alloc.ref_count(p) for p in range(6)] == [1, 1, 1, 1, 1, 0]
    assert alloc.num_available() == 1
    with pytest.raises(OutOfPages, match="need 2 KV pages, only 1 of 6"):
        alloc.allocate(2)
    assert alloc.num_available() == 1  # a failed allocation takes nothing


def test_released_uncached_pages_are_free_in_page_order(alloc):
    pages = alloc.allocate(3)
    alloc.release(pages)
    assert [alloc.ref_count(p) for p in pages] == [0, 0, 0]
    assert alloc.eviction_order() == [0, 1, 2, 3, 4, 5]
    assert alloc.allocate(4) == [0, 1, 2, 3]


def test_free_pages_go_out_as_one_contiguous_run_where_there_is_one(alloc):
    a, b, c = alloc.allocate(2), alloc.allocate(1), alloc.allocate(3)  # [0, 1] [2] [3, 4, 5]
    alloc.release(a)
    alloc.release(c)  # free: 0 1 . 3 4 5
    assert alloc.allocate(3) == [3, 4, 5]  # the first run long enough, not the lowest ids
    assert alloc.allocate(1) == [0]  # a run of one: the lowest
    alloc.release(b)  # free: 1 2
    assert alloc.allocate(2) == [1, 2]
    alloc.release([0, 1, 2, 4])  # free: 0 1 2 . 4 (3 and 5 held)
    assert alloc.allocate(4) == [0, 1, 2, 4]  # no run of 4: the lowest ids
    alloc.check_integrity()


def test_retain_and_release_count_references(alloc):
    pages = alloc.allocate(2)
    alloc.retain([0])
    assert alloc.ref_count(0) == 2
    alloc.release(pages)
    assert (alloc.ref_count(0), alloc.ref_count(1)) == (1, 0)
    assert alloc.eviction_order() == [1, 2, 3, 4, 5]
    alloc.release([0])
    with pytest.raises(ValueError, match="already 0"):
        alloc.release([0])
    with pytest.raises(ValueError, match="retain of free page 3"):
        alloc.retain([3])


def test_cached_pages_are_evicted_lru_after_free_pages(alloc):
    a = alloc.allocate(2)              # [0, 1]
    b = alloc.allocate(2)              # [2, 3]
    for h, p in zip(["a0", "a1", "b0", "b1"], a + b):
        assert alloc.cache(h, p) == p
    alloc.release(a)                   # evictable: 1, 0
    alloc.release(b)                   # evictable: 1, 0, 3, 2
    assert alloc.num_cached() == 4 and alloc.num_available() == 6
    assert alloc.eviction_order() == [4, 5, 1, 0, 3, 2]
    assert alloc.allocate(3) == [4, 5, 1]     # free first, then the LRU cached page
    assert alloc.num_evicted == 1
    assert alloc.page_hash(1) is None and alloc.num_cached() == 3
    # a1 is gone, so a's chain now matches only its root page
    assert alloc.match_prefix(["a0", "a1"]) == [0]
    assert alloc.ref_count(0) == 1
    assert alloc.eviction_order() == [3, 2]


def test_match_prefix_retains_and_stops_at_first_miss(alloc):
    pages = alloc.allocate(3)
    for h, p in zip(["h0", "h1", "h2"], pages):
        alloc.cache(h, p)
    alloc.release(pages)
    assert alloc.match_prefix(["h0", "h1", "zz", "h2"]) == [0, 1]
    assert [alloc.ref_count(p) for p in range(3)] == [1, 1, 0]
    assert alloc.match_prefix(["h0"]) == [0]
    assert alloc.ref_count(0) == 2
    assert alloc.match_prefix(["nope"]) == []
    alloc.release([0, 1])
    alloc.release([0])
    # released pages become most recently used: 2 (untouched) is evicted first
    assert alloc.eviction_order() == [3, 4, 5, 2, 1, 0]


def test_cache_existing_hash_keeps_its_page(alloc):
    first = alloc.allocate(1)[0]
    alloc.cache("h", first)
    dup = alloc.allocate(1)[0]
    assert alloc.cache("h", dup) == first
    assert alloc.page_hash(dup) is None
    alloc.release([dup])
    assert alloc.eviction_order()[0] == dup  # uncached: straight back to the free list (lowest id free)
    with pytest.raises(ValueError, match="already cached"):
        alloc.cache("other", first)
    with pytest.raises(ValueError, match="nobody holds"):
        alloc.cache("x", 5)
    alloc.release([first])


def test_flush_frees_evictable_and_uncaches_used(alloc):
    pages = alloc.allocate(3)
    for h, p in zip("abc", pages):
        alloc.cache(h, p)
    alloc.release(pages[:2])
    assert alloc.flush() == 3
    assert alloc.num_cached() == 0 and alloc.match_prefix(["a"]) == []
    assert alloc.eviction_order() == [0, 1, 3, 4, 5]
    alloc.release([pages[2]])
    assert alloc.eviction_order() == [0, 1, 2, 3, 4, 5]


def test_check_integrity_detects_corruption():
    a = PageAllocator(3)
    a.allocate(1)
    a._free.append(0)  # page 0 is used and free at once
    with pytest.raises(AssertionError):
        a.check_integrity()


def test_persisted_pages_are_evicted_before_pages_the_store_lacks(alloc):
    pages = alloc.allocate(4)                      # [0, 1, 2, 3]
    for i, p in enumerate(pages):
        alloc.cache(f"h{i}", p)
    alloc.mark_persisted([1, 3])
    alloc.mark_unpersisted([0], "dropped")
    alloc.release(pages)                           # released tail-first: 3, 2, 1, 0
    assert alloc.num_unpersisted() == 2
    assert alloc.num_available_without_loss() == 2 + 2   # free 4, 5 + persisted 3, 1
    assert alloc.eviction_order() == [4, 5, 3, 1, 2, 0]
    assert alloc.lru_unpersisted(5) == [2, 0]
    assert alloc.allocate(4) == [4, 5, 3, 1]       # nothing lost yet
    assert not alloc.evicted_unpersisted
    assert alloc.allocate(2) == [2, 0]             # now pages the store lacks go, each counted by reason
    assert alloc.evicted_unpersisted == {"not_written": 1, "dropped": 1}


def test_lookup_matches_past_a_gap_and_marking_moves_evictable_pages(alloc):
    pages = alloc.allocate(3)
    for h, p in zip(["a", "b", "c"], pages):
        alloc.cache(h, p)
    alloc.release(pages)
    assert alloc.lookup(["a", "zz", "c"]) == [0, None, 2]
    assert (alloc.ref_count(0), alloc.ref_count(1), alloc.ref_count(2)) == (1, 0, 1)
    alloc.release([0, 2])
    alloc.mark_persisted([1])                      # evictable page: moves to the persisted LRU
    assert alloc.is_persisted(1) and alloc.eviction_order()[3:] == [1, 2, 0]
    alloc.mark_unpersisted([1], "dropped")         # persisted pages keep their state
    assert alloc.unpersisted_reason(1) is None
    assert alloc.flush() == 3 and alloc.evicted_unpersisted == {"flush": 2}


def test_a_page_that_left_the_store_is_kept_after_pages_the_store_holds(alloc):
    pages = alloc.allocate(3)
    for h, p in zip(["a", "b", "c"], pages):
        alloc.cache(h, p)
    alloc.mark_persisted(pages)
    alloc.release(pages)                            # persisted LRU: 2, 1, 0
    alloc.mark_left_store(alloc.pages_of(["b", "zz"]), "store_evicted")
    assert not alloc.is_persisted(1) and alloc.unpersisted_reason(1) == "store_evicted"
    assert alloc.eviction_order() == [3, 4, 5, 2, 0, 1]
    alloc.allocate(6)
    assert alloc.evicted_unpersisted == {"store_evicted": 1}


def test_pages_the_store_dropped_leave_l1_newest_first(alloc):
    pages = alloc.allocate(6)
    for i, p in enumerate(pages):
        alloc.cache(f"h{i}", p)
    alloc.mark_left_store([0, 1, 2], "store_evicted")   # dropped in this order: 0 first
    alloc.release([0])
    alloc.release([1])
    alloc.release([2])
    # round-robin revisits: keep the oldest dropped pages, give up the newest first
    assert alloc.allocate(2) == [2, 1]
    assert alloc.evicted_unpersisted == {"store_evicted": 2}
    alloc.release(pages[3:] + [2, 1])


def test_pages_the_write_policy_holds_back_go_after_stored_pages_and_before_dropped_ones(alloc):
    pages = alloc.allocate(6)
    for i, p in enumerate(pages):
        alloc.cache(f"h{i}", p)
    alloc.mark_persisted([0])
    alloc.mark_left_store([1], LEFT_STORE)
    alloc.mark_unpersisted([2, 3], UNWRITTEN)  # write_through_selective: used too few times yet
    alloc.release(pages)  # released tail-first: LRU order 5 4 3 2 1 0
    # without loss: free, stored, held back by policy (LRU), dropped by the store; not 4 and 5
    assert alloc.num_available_without_loss() == 4
    assert alloc.eviction_order() == [0, 3, 2, 1, 5, 4]
    assert alloc.allocate(3) == [0, 3, 2]
    assert alloc.evicted_unpersisted == {UNWRITTEN: 2}  # a loss by policy, counted under its reason
    alloc.release([0, 3, 2])


def test_uses_count_caching_and_every_lookup_hit(alloc):
    page = alloc.allocate(1)[0]
    assert alloc.uses(page) == 0
    alloc.cache("a", page)
    assert alloc.uses(page) == 1
    alloc.lookup(["a", "b"])
    alloc.match_prefix(["a"])
    assert alloc.uses(page) == 3
    alloc.release([page] * 3)
    alloc.allocate(6)  # evicted: its count goes with its hash
    assert alloc.uses(page) == 0
    alloc.release(range(6))


def test_pages_unused_for_longer_than_stale_after_go_before_every_tier():
    now = [0.0]
    alloc = PageAllocator(6, clock=lambda: now[0])
    pages = alloc.allocate(6)
    for i, p in enumerate(pages):
        alloc.cache(f"h{i}", p)
    alloc.release(pages[:2])  # t=0: an ended conversation's pages (unpersisted)
    now[0] = 100.0
    alloc.mark_persisted(pages[2:4])
    alloc.release(pages[2:4])  # t=100: the store holds these
    alloc.mark_left_store(pages[4:], LEFT_STORE)
    alloc.release(pages[4:])  # t=100: a live conversation's pages the store dropped
    assert alloc.allocate(1) == [pages[3]]  # no bound: persisted first (released tail first), as before
    alloc.stale_after = 60.0
    now[0] = 120.0
    # pages[0:2] have been unused for 120 s > 60 s: they go first, oldest first, although the store
    # lacks them; the live conversation's pages stay
    assert alloc.eviction_order()[:2] == [pages[1], pages[0]]
    assert sorted(alloc.allocate(2)) == sorted(pages[:2])
    assert alloc.evicted_unpersisted["not_written"] == 2
    assert alloc.allocate(1) == [pages[2]]  # then the usual order
    alloc.check_integrity()
