"""KVStore without a master: disabled by config, never raising on ops, clear errors on bad input."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from pdorch.config import StoreConfig
from store_client.metrics import StoreMetrics
from store_client.results import LoadResult, SaveResult, classify
from store_client.store import KVStore


@pytest.fixture
def disabled():
    reg = CollectorRegistry()
    store = KVStore(StoreConfig(enabled=False), 4096, StoreMetrics(reg))
    yield store, reg
    store.close()


def test_disabled_store_misses_everything_without_raising(disabled):
    store, reg = disabled
    assert not store.enabled
    assert not store.wait_enabled(0.05)
    assert store.match_prefix(["a", "b"]) == 0
    assert store.load(["a", "b", "c"], [1, 2, 3]) == LoadResult(0, "disabled", (False, False, False))
    assert store.save(["a"], [1]) == SaveResult(0, 0, 1, "disabled", (False,))
    assert store.load([], []) == LoadResult(0, "ok")
    assert reg.get_sample_value("pdorch_store_miss_pages_total", {"op": "load", "reason": "disabled"}) == 3
    assert reg.get_sample_value("pdorch_store_miss_pages_total", {"op": "match", "reason": "disabled"}) == 2
    assert reg.get_sample_value("pdorch_store_enabled") == 0


def test_bad_input_is_named(disabled):
    store, _ = disabled
    with pytest.raises(ValueError, match="2 keys but 1 page addresses"):
        store.load(["a", "b"], [1])
    with pytest.raises(ValueError, match="register_buffer"):
        store.register_buffer(0, 10)
    with pytest.raises(ValueError, match="page_nbytes"):
        KVStore(StoreConfig(enabled=False), 0, StoreMetrics(CollectorRegistry()))


@pytest.mark.parametrize("code, elapsed, reason", [
    (-704, 0.0, "absent"), (-704, 99.0, "absent"), (-800, 0.0, "transfer_failed"), (-900, 0.0, "rpc_failed"),
    (-200, 0.0, "no_space"), (-800, 10.0, "timeout"), (-1, 0.0, "transfer_failed"),
])
def test_negative_codes_map_to_reasons(code, elapsed, reason):
    assert classify(code, elapsed, deadline_s=10.0) == reason


def test_a_load_names_each_missing_pages_reason_and_an_object_of_another_size_apart(disabled):
    store, reg = disabled  # page_nbytes 4096: a positive other size is a foreign object (another layout)
    result = store._load_result([4096, -704, 100, -800], 0.0, [False] * 4)
    assert result.page_ok == (True, False, False, False) and result.reason == "absent"
    assert result.miss_reasons == ("absent", "size_mismatch", "transfer_failed")
    # metrics keep counting the foreign object as transfer_failed
    assert reg.get_sample_value("pdorch_store_miss_pages_total", {"op": "load", "reason": "transfer_failed"}) == 2


def test_metrics_can_be_created_once_per_registry():
    reg = CollectorRegistry()
    StoreMetrics(reg)
    with pytest.raises(ValueError, match="Duplicated"):
        StoreMetrics(reg)


class FakeSsdClient:
    """A Mooncake client whose replica lookup blocks until the read has started (so it can only pass
    when the lookup runs beside the read, not before it): keys starting with "d" are disk-only."""

    def __init__(self):
        import threading

        self.read_started = threading.Event()
        self.lookup_thread = None

    def batch_get_replica_desc(self, keys):
        import threading
        from types import SimpleNamespace

        self.lookup_thread = threading.current_thread().name
        assert self.read_started.wait(5), "the lookup ran before the read started"
        done = SimpleNamespace(name="COMPLETE")
        disk = SimpleNamespace(status=done, is_memory_replica=lambda: False, is_disk_replica=lambda: True,
                               is_local_disk_replica=lambda: False)
        mem = SimpleNamespace(status=done, is_memory_replica=lambda: True, is_disk_replica=lambda: False,
                              is_local_disk_replica=lambda: False)
        return {k: [disk] if k.startswith("d") else [mem] for k in keys}

    def batch_get_into(self, keys, addrs, sizes):
        self.read_started.set()
        return list(sizes)


def test_ssd_tier_lookup_runs_beside_the_read_and_attributes_pages(tmp_path):
    store = KVStore(StoreConfig(enabled=False, ssd_path=str(tmp_path)), 4096, StoreMetrics(CollectorRegistry()),
                    component="t")
    fake = FakeSsdClient()
    store._connector.client = lambda: fake  # connected, without a master
    try:
        got = store.load(["d0", "m1", "d2"], [1, 2, 3])
        assert got == LoadResult(3, "ok", (True, True, True), (True, False, True))
        assert fake.lookup_thread.startswith("store-tier")
    finally:
        store.close()


class FakeAuditClient:
    """batch_is_exist of a new leader: `absent` keys answered 0, the others 1."""

    def __init__(self, absent: set[str]):
        self.absent, self.asked, self.removed = absent, [], []

    def batch_is_exist(self, keys):
        self.asked.append(list(keys))
        return [0 if k in self.absent else 1 for k in keys]

    def batch_remove(self, keys):
        self.removed.append(list(keys))
        return [-704 if k in self.absent else 0 for k in keys]


def test_after_a_leader_switch_keys_missing_at_two_looks_are_lost_and_handed_back(monkeypatch, disabled):
    import store_client.recent_writes as recent_mod
    import store_client.store as store_mod

    store, reg = disabled
    monkeypatch.setattr(recent_mod, "RECHECK_S", 0.0)
    fake = FakeAuditClient({"a", "b"})
    store._connector.client = lambda: fake
    lost = []
    store.on_lost = lost.append
    store.recent.add(["a", "b", "c"])
    switched = store_mod.time.monotonic()
    assert store._audit_recent_writes(switched) is False  # first look: a and b suspected, not yet lost
    fake.absent = {"a"}  # b read back a moment later (a new leader's first answers are not final)
    assert store._audit_recent_writes(switched) is True
    assert fake.asked == [["a", "b", "c"], ["a", "b"]] and lost == [["a"]]
    assert fake.removed == [["a"]]  # dropped whole: no object of a lost page stays behind
    assert reg.get_sample_value("pdorch_store_lost_on_leader_change_pages_total") == 1
    # nothing missing at the first look: done at once, nothing handed back
    fake.absent = set()
    assert store._audit_recent_writes(switched + 1) is True and lost == [["a"]]


def test_a_page_the_new_leader_holds_only_part_of_is_dropped_whole(monkeypatch):
    import store_client.recent_writes as recent_mod
    from store_client.page_objects import PageObjects

    monkeypatch.setattr(recent_mod, "RECHECK_S", 0.0)
    store = KVStore(StoreConfig(enabled=False), 2048, StoreMetrics(CollectorRegistry()),
                    objects=PageObjects(2, range(2), 1024))
    try:
        fake = FakeAuditClient({"p-g1"})  # one object of page p lost, its other one still there
        store._connector.client = lambda: fake
        lost = []
        store.on_lost = lost.append
        store.recent.add(["p", "q"])
        switched = store.recent._clock()
        assert store._audit_recent_writes(switched) is False
        assert store._audit_recent_writes(switched) is True
        assert lost == [["p"]] and fake.removed == [["p-g0", "p-g1"]]
    finally:
        store.close()
