"""store_client.recent_writes: which keys the audit after a master leader switch checks."""

from store_client.recent_writes import RecentWrites


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_keys_written_within_the_window_before_the_switch_or_since_are_audited_once_each():
    clock = Clock()
    recent = RecentWrites(window_s=10, max_keys=100, clock=clock)
    recent.add(["old"])
    clock.now = 115.0
    recent.add(["a", "b"])
    clock.now = 121.0
    recent.add(["b", "c"])  # written again after the switch: still one key to check
    assert recent.since(120.0) == ["a", "b", "c"]  # "old" was written 20 s before the switch
    assert recent.since(130.0) == ["b", "c"]


def test_the_record_is_bounded_and_pruned():
    clock = Clock()
    recent = RecentWrites(window_s=10, max_keys=3, clock=clock)
    recent.add(["a", "b", "c", "d"])
    assert recent.since(clock.now) == ["b", "c", "d"]  # the newest max_keys
    clock.now += 25
    assert recent.since(0.0) == []  # older than two windows: pruned
    assert len(recent._written) == 0
