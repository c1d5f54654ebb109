"""store_client.recent_writes: which pages the audit after a master leader switch checks, and how."""

import pytest

from store_client.page_objects import PageObjects
from store_client.recent_writes import RecentWrites

WHOLE = PageObjects.whole_page(4096)


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Leader:
    """batch_is_exist of a new leader: the objects in `held` answer 1, the others 0."""

    def __init__(self, held: set[str]):
        self.held, self.asked = held, []

    def batch_is_exist(self, keys):
        self.asked.append(list(keys))
        return [1 if k in self.held else 0 for k in keys]


def test_pages_written_within_the_window_before_the_switch_or_since_are_audited_once_each():
    clock = Clock()
    recent = RecentWrites(window_s=10, max_pages=100, objects=WHOLE, clock=clock)
    recent.add(["old"])
    clock.now = 115.0
    recent.add(["a", "b"])
    clock.now = 121.0
    recent.add(["b", "c"])  # written again after the switch: still one page to check
    assert recent.since(120.0) == ["a", "b", "c"]  # "old" was written 20 s before the switch
    assert recent.since(130.0) == ["b", "c"]


def test_the_window_is_by_time_not_by_count():
    clock = Clock()
    recent = RecentWrites(window_s=10, max_pages=100_000, objects=WHOLE, clock=clock)
    for second in range(10):  # 5,000 pages a second for 10 s: all within the window
        clock.now = 100.0 + second
        recent.add([f"p{second}-{i}" for i in range(5000)])
    assert len(recent.since(clock.now)) == 50_000


def test_the_record_is_capped_newest_first_and_pruned_after_two_windows():
    clock = Clock()
    recent = RecentWrites(window_s=10, max_pages=3, objects=WHOLE, clock=clock)
    recent.add(["a", "b", "c", "d"])
    assert recent.since(clock.now) == ["b", "c", "d"]  # the newest max_pages
    clock.now += 25
    recent.add(["e"])  # the others are older than two windows: pruned as it is added
    assert recent.since(0.0) == ["e"] and len(recent) == 1


def test_a_page_missing_any_object_at_two_looks_is_lost_whole(monkeypatch):
    import store_client.recent_writes as recent_mod

    monkeypatch.setattr(recent_mod, "RECHECK_S", 0.0)
    clock = Clock()
    objects = PageObjects(4, range(4), 1024)  # four objects a page
    recent = RecentWrites(window_s=10, max_pages=100, objects=objects, clock=clock)
    recent.add(["p1", "p2", "p3"])
    every = {f"{p}-g{g}" for p in ("p1", "p2", "p3") for g in range(4)}
    leader = Leader(every - {"p2-g3", "p3-g0"})  # p2 and p3 each lack one object
    assert recent.audit(leader, clock.now) is None  # first look: suspects only
    assert leader.asked == [[f"{p}-g{g}" for p in ("p1", "p2", "p3") for g in range(4)]]  # each object once
    leader.held.add("p3-g0")  # p3's object read back a moment later
    assert recent.audit(leader, clock.now) == ["p2"]
    assert leader.asked[1] == ["p2-g0", "p2-g1", "p2-g2", "p2-g3", "p3-g0", "p3-g1", "p3-g2", "p3-g3"]


def test_a_failed_answer_is_looked_at_again():
    class Failing(Leader):
        def batch_is_exist(self, keys):
            return [-900] * len(keys)

    recent = RecentWrites(window_s=10, max_pages=10, objects=WHOLE, clock=Clock())
    recent.add(["a"])
    assert recent.audit(Failing(set()), 100.0) is None


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError, match="window_s > 0 and max_pages >= 1"):
        RecentWrites(window_s=0, max_pages=10, objects=WHOLE)
