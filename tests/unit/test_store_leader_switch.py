"""store_client.connector: a leader switch is a new term in etcd, not a new address."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from pdorch.config import StoreConfig
from store_client.connector import PROBE_KEY, RECOVER_POLL_S, StoreConnector
from store_client.master_view import Leader
from store_client.metrics import StoreMetrics


class FakeView:
    """The master view as etcd answers it, one answer per read."""

    def __init__(self, *answers: Leader | None):
        self.answers = list(answers)

    def term(self) -> Leader | None:
        return self.answers.pop(0)


def watching(*answers: Leader | None) -> tuple[StoreConnector, CollectorRegistry]:
    reg = CollectorRegistry()
    cfg = StoreConfig(master_address="etcd://127.0.0.1:2379", metadata_server="etcd://127.0.0.1:2379")
    connector = StoreConnector(cfg, StoreMetrics(reg))  # never started: the test hands it each read
    connector._view = FakeView(*answers)
    return connector, reg


def read_view(connector: StoreConnector) -> None:
    """One read of the view, as the connector does when its etcd watch says the view changed."""
    connector._on_term(connector._view.term())


def changes(reg: CollectorRegistry) -> float:
    return reg.get_sample_value("pdorch_store_master_leader_changes_total")


def test_a_master_back_at_the_same_address_with_a_new_term_is_a_switch():
    a1, a2 = Leader("10.0.0.1:50151", 7, 111), Leader("10.0.0.1:50151", 19, 222)
    connector, reg = watching(a1, None, a2)
    read_view(connector)
    assert connector.leader == "10.0.0.1:50151" and connector._audit_due is None and changes(reg) == 0
    read_view(connector)  # the lease ran out: none leads
    assert reg.get_sample_value("pdorch_store_master_leading") == 0 and connector._audit_due is None
    read_view(connector)  # the same address won again: a new term
    assert connector.leader == "10.0.0.1:50151" and connector._audit_due is not None and changes(reg) == 1


def test_a_new_term_seen_without_the_gap_between_is_a_switch_too():
    connector, reg = watching(Leader("a:1", 7, 111), Leader("a:1", 9, 111))  # etcd revision moved on
    read_view(connector)
    read_view(connector)
    assert changes(reg) == 1 and connector._audit_due is not None


def test_the_same_term_read_again_after_an_etcd_gap_is_no_switch():
    term = Leader("a:1", 7, 111)
    connector, reg = watching(term, None, Leader("a:1", 7, 111))  # None: etcd did not answer one read
    for _ in range(3):
        read_view(connector)
    assert changes(reg) == 0 and connector._audit_due is None


def test_another_address_is_a_switch():
    connector, reg = watching(Leader("a:1", 7, 111), Leader("b:1", 12, 333))
    read_view(connector)
    read_view(connector)
    assert connector.leader == "b:1" and changes(reg) == 1


class FakeClient:
    """Stands for the connected Mooncake client (only its identity matters here)."""


def connected(connector: StoreConnector) -> None:
    connector._raw = connector._client = FakeClient()


def test_a_new_term_disables_the_store_at_once_and_looks_for_it_back_quickly():
    connector, _ = watching(Leader("a:1", 7, 111), Leader("b:1", 12, 333))
    read_view(connector)
    connected(connector)
    assert connector._interval() == 1.0  # connected: the health check's pace
    read_view(connector)  # the standby won: requests must miss now, not wait on the old master
    assert connector.client() is None
    assert connector._interval() == RECOVER_POLL_S != connector.cfg.reconnect_interval_s


def test_none_leading_keeps_the_client_but_looks_for_the_switch_quickly():
    connector, _ = watching(Leader("a:1", 7, 111), None)
    read_view(connector)
    connected(connector)
    read_view(connector)  # the lease ran out (or etcd did not answer): ops still decide for themselves
    assert connector.client() is not None and connector.leader == "a:1"
    connector._client = None  # an op then saw the master gone
    assert connector._interval() == RECOVER_POLL_S


def test_without_a_switch_a_lost_store_retries_at_reconnect_interval_s():
    connector, _ = watching(Leader("a:1", 7, 111))
    read_view(connector)
    assert connector.client() is None and connector._recover_until == 0.0
    connector._watch._broken = False  # the watch runs: no view poll either
    assert connector._interval() == connector.cfg.reconnect_interval_s


class FakeRaw:
    """The Mooncake client as the recovery check sees it: health, and is_exist of one key."""

    def __init__(self, health: int, exists: int):
        self.health, self.exists, self.asked = health, exists, []

    def health_check(self) -> int:
        return self.health

    def batch_is_exist(self, keys: list[str]) -> list[int]:
        self.asked += keys
        return [self.exists]


def lost_with(raw: FakeRaw, canary: str | None) -> tuple[StoreConnector, CollectorRegistry]:
    connector, reg = watching()
    connector._raw, connector._client, connector._canary = raw, None, canary
    return connector, reg


def test_the_store_is_back_only_when_the_master_knows_the_clients_own_segment_again(monkeypatch):
    import store_client.connector as connector_module

    now = [100.0]
    monkeypatch.setattr(connector_module.time, "monotonic", lambda: now[0])
    raw = FakeRaw(health=0, exists=0)  # the new leader answers, but our segment is not re-mounted yet
    connector, reg = lost_with(raw, "pdorch-canary/h:1/7/ab")
    connector._try_recover()
    now[0] += connector_module.CANARY_GRACE_S / 2
    connector._try_recover()
    assert connector.client() is None and raw.asked == ["pdorch-canary/h:1/7/ab"] * 2
    assert reg.get_sample_value("pdorch_store_enabled") == 0
    raw.exists = 1  # re-mounted: the canary reads present
    connector._try_recover()
    assert connector.client() is raw and reg.get_sample_value("pdorch_store_enabled") == 1


def test_a_master_that_answers_absent_for_the_grace_period_lost_everything_and_the_store_is_back(monkeypatch):
    import store_client.connector as connector_module

    now = [100.0]
    monkeypatch.setattr(connector_module.time, "monotonic", lambda: now[0])
    raw = FakeRaw(health=0, exists=0)  # a master restarted empty never knows the canary again
    connector, _ = lost_with(raw, "pdorch-canary/h:1/7/ab")
    put = []
    monkeypatch.setattr(connector, "_put_canary", lambda r: put.append(r))
    connector._try_recover()
    raw.health = 2  # an unhealthy tick restarts the wait
    now[0] += connector_module.CANARY_GRACE_S
    connector._try_recover()
    raw.health = 0
    connector._try_recover()
    assert connector.client() is None and put == []
    now[0] += connector_module.CANARY_GRACE_S
    connector._try_recover()
    assert connector.client() is raw and put == [raw]  # back, with a canary written again


def test_without_a_canary_an_answered_rpc_is_enough():
    raw = FakeRaw(health=0, exists=0)
    connector, _ = lost_with(raw, None)
    connector._try_recover()
    assert connector.client() is raw and raw.asked == [PROBE_KEY]

