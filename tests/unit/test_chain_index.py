"""ChainIndex: exact victim order (tails of old chains before heads), LRU at weight 0, re-touch,
the bound, lazy heap entries and compaction."""

from __future__ import annotations

import pytest

from store_client.chain_index import ChainIndex


class FakeClock:
    def __init__(self, t: float = 0.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def chain(name: str, n: int) -> list[str]:
    return [f"{name}{i}" for i in range(n)]


def test_tails_of_old_chains_go_before_heads():
    clock = FakeClock(10.0)
    idx = ChainIndex(100, depth_weight_s=1.0, clock=clock)
    idx.touch(chain("a", 4))  # priorities 10, 9, 8, 7
    clock.t = 12.0
    idx.touch(chain("b", 3))  # priorities 12, 11, 10
    # a0 and b2 tie at 10: the deeper page goes first.
    assert idx.victims(7) == ["a3", "a2", "a1", "b2", "a0", "b1", "b0"]
    assert idx.victims(2) == ["a3", "a2"]  # victims() does not consume
    assert len(idx) == 7


def test_depth_weight_zero_is_lru_with_tails_first_on_ties():
    clock = FakeClock(1.0)
    idx = ChainIndex(100, depth_weight_s=0.0, clock=clock)
    idx.touch(chain("a", 3))
    clock.t = 2.0
    idx.touch(chain("b", 2))
    clock.t = 3.0
    idx.touch(["a1"], first_depth=1)
    assert idx.victims(5) == ["a2", "a0", "b1", "b0", "a1"]


def test_retouch_makes_a_chain_young_and_extends_it():
    clock = FakeClock(0.0)
    idx = ChainIndex(100, depth_weight_s=1.0, clock=clock)
    idx.touch(chain("a", 3))  # 0, -1, -2
    clock.t = 1.0
    idx.touch(chain("b", 3))  # 1, 0, -1
    clock.t = 5.0
    idx.touch(chain("a", 5))  # the next round: a resent and extended by 2 pages: 5, 4, 3, 2, 1
    assert idx.victims(8) == ["b2", "b1", "a4", "b0", "a3", "a2", "a1", "a0"]


def test_touch_with_first_depth_and_a_shared_page_keeps_the_smaller_depth():
    clock = FakeClock(0.0)
    idx = ChainIndex(100, depth_weight_s=1.0, clock=clock)
    idx.touch(["x5", "x6"], first_depth=5)  # decode offload continues a chain at depth 5
    assert (idx.depth("x5"), idx.depth("x6")) == (5, 6)
    idx.touch(["s", "x6"], first_depth=0)  # x6 also the second page of another chain
    assert idx.depth("x6") == 1
    idx.touch(["x6"], first_depth=9)
    assert idx.depth("x6") == 1
    assert idx.depth("nope") is None
    with pytest.raises(ValueError):
        idx.touch(["y"], first_depth=-1)


def test_forget_and_refresh():
    clock = FakeClock(0.0)
    idx = ChainIndex(100, depth_weight_s=1.0, clock=clock)
    idx.touch(chain("a", 3))  # 0, -1, -2
    clock.t = 1.0
    idx.touch(chain("b", 2))  # 1, 0
    idx.forget(["a2", "unknown"])
    assert len(idx) == 4
    assert idx.victims(10) == ["a1", "b1", "a0", "b0"]
    clock.t = 3.0
    idx.refresh(["a1", "unknown"])  # used now at its own depth: 3 - 1 = 2
    assert idx.victims(10) == ["b1", "a0", "b0", "a1"]
    assert len(idx) == 4


def test_bound_forgets_the_lowest_priority_keys_and_counts_them():
    clock = FakeClock(0.0)
    idx = ChainIndex(5, depth_weight_s=1.0, clock=clock)
    idx.touch(chain("a", 4))  # 0, -1, -2, -3
    clock.t = 10.0
    idx.touch(chain("b", 3))  # 10, 9, 8 -> a3 and a2 dropped
    assert len(idx) == 5
    assert idx.forgotten == 2
    assert idx.victims(10) == ["a1", "a0", "b2", "b1", "b0"]
    clock.t = 20.0
    idx.touch(chain("c", 10))  # more than the bound in one call: the deepest of c drop too
    assert len(idx) == 5 and idx.forgotten == 12
    assert idx.victims(10) == ["c4", "c3", "c2", "c1", "c0"]


def test_same_clock_retouch_leaves_no_duplicate_victims():
    idx = ChainIndex(100, depth_weight_s=1.0, clock=FakeClock(0.0))
    for _ in range(3):
        idx.touch(chain("a", 3))
    assert idx.victims(10) == ["a2", "a1", "a0"]
    assert idx.victims(10) == ["a2", "a1", "a0"]


def test_compact_drops_stale_entries_and_keeps_the_order():
    clock = FakeClock(0.0)
    idx = ChainIndex(10_000, depth_weight_s=1.0, clock=clock)
    for t in range(13):  # 13 rounds of the same 100 pages: 12 of every 13 heap entries are stale
        clock.t = float(t)
        idx.touch(chain("a", 100))
    assert len(idx._heap) > 2 * len(idx) + 1024
    assert idx.compact()
    assert len(idx._heap) == len(idx) == 100
    assert idx.victims(100) == [f"a{i}" for i in range(99, -1, -1)]
    assert not idx.compact()  # nothing stale left


def test_touch_compacts_inline_only_when_nobody_else_does():
    idx = ChainIndex(10_000, depth_weight_s=1.0, clock=FakeClock(0.0))
    for _ in range(60):
        idx.touch(chain("a", 100))
    assert len(idx._heap) <= 4 * len(idx) + 1024


def test_touch_and_forget_during_compact_are_not_lost(monkeypatch):
    import store_client.chain_index as ci

    clock = FakeClock(0.0)
    idx = ChainIndex(100_000, depth_weight_s=0.0, clock=clock)
    for t in range(4):
        clock.t = float(t)
        idx.touch(chain("a", 600))
    real_heap_of = ci._heap_of

    def heap_of_while_others_run(pages):
        # the rebuild runs off the lock: a scheduler touches and the evictor forgets meanwhile
        clock.t = 100.0
        idx.touch(["late", "a0"])
        idx.forget(["a599"])
        return real_heap_of(pages)

    monkeypatch.setattr(ci, "_heap_of", heap_of_while_others_run)
    assert idx.compact()
    assert len(idx) == 600
    order = idx.victims(1000)
    assert order[:2] == ["a598", "a597"]  # a599 forgotten, a0 re-touched
    assert order[-2:] == ["a0", "late"]  # both used at t=100 at depth 0 (a0 keeps its depth): key order


def _learn_gap(idx: ChainIndex, clock: FakeClock, gap: float, samples: int = 8) -> None:
    """Conversations 'g0'.. come back every `gap` seconds: `samples` lookups from the head."""
    for i in range(samples):
        idx.touch([f"g{i}h"], lookup=True)
        clock.t += gap
        idx.touch([f"g{i}h"], lookup=True)  # a lookup from the head of a known chain: one sample, `gap`


def test_nothing_is_stale_before_enough_conversations_came_back():
    clock = FakeClock(0.0)
    idx = ChainIndex(100, depth_weight_s=60.0, clock=clock)
    idx.touch(chain("old", 2))
    _learn_gap(idx, clock, 10.0, samples=7)
    clock.t += 1000.0
    assert idx.stale_after() is None and not idx.is_stale("old0")
    idx.touch(chain("new", 3), first_depth=5)  # a write deep in a chain is not a sample
    assert idx.stale_after() is None


def test_a_write_back_of_a_head_is_no_conversation_coming_back():
    # A request looks its prompt up (new pages included), then writes back its pages, page 0 too,
    # seconds later: not a reuse gap. Counted, every conversation looked stale between rounds.
    clock = FakeClock(0.0)
    idx = ChainIndex(100, depth_weight_s=60.0, clock=clock)
    for i in range(20):
        idx.touch(chain(f"c{i}", 4), lookup=True)  # first sight: nothing known, no sample
        clock.t += 2.0
        idx.touch([f"c{i}0"], first_depth=0)  # its write-back
    assert idx.stale_after() is None
    clock.t += 100.0
    for i in range(8):  # the conversations come back with one more page each: samples of ~100 s
        idx.touch(chain(f"c{i}", 5), lookup=True)
    assert idx.stale_after() == pytest.approx(2.0 * (100.0 + 2.0 * (20 - 1)), rel=0.1)


def test_pages_of_ended_conversations_leave_before_live_tails():
    clock = FakeClock(0.0)
    idx = ChainIndex(100, depth_weight_s=60.0, clock=clock)
    idx.touch(chain("dead", 3))  # an ended conversation: never looked up again
    clock.t = 20.0
    _learn_gap(idx, clock, 10.0)  # live conversations come back every 10 s
    assert idx.stale_after() == pytest.approx(20.0)
    idx.touch(chain("live", 8))  # deep pages of a live chain, touched now
    # By depth weight alone the live tail (priority now - 420 s) would go before dead0 (priority 0).
    victims = idx.victims(len(idx))
    assert victims[:3] == ["dead0", "dead1", "dead2"]  # stale, oldest first (ties: as touched)
    # then the other stale pages (the sample chains unused for > 20 s), then the live tail
    assert victims[3:8] == [f"g{i}h" for i in range(5)] and victims[8] == "live7"
    assert idx.is_stale("dead0") and not idx.is_stale("live7")
    idx.touch(["dead0"], lookup=True)  # a conversation that does come back is fresh again
    assert not idx.is_stale("dead0") and "dead0" not in idx.victims(3)


def test_stale_victims_are_not_offered_twice_and_stay_in_the_heap():
    clock = FakeClock(0.0)
    idx = ChainIndex(100, depth_weight_s=1.0, clock=clock)
    idx.touch(chain("a", 3))
    clock.t = 100.0
    _learn_gap(idx, clock, 1.0)
    victims = idx.victims(20)
    assert len(victims) == len(set(victims)) == len(idx)
    assert victims[:3] == ["a0", "a1", "a2"]
    idx.refresh(["a0"])  # leased: used now, so no longer stale, and still reachable by priority
    assert "a0" in idx.victims(20) and idx.victims(20)[:2] == ["a1", "a2"]
