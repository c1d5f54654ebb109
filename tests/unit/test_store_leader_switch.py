"""store_client.connector: a leader switch is a new term in etcd, not a new address."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from pdorch.config import StoreConfig
from store_client.connector import StoreConnector
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
    connector = StoreConnector(cfg, StoreMetrics(reg))  # never started: the test drives _watch_leader
    connector._view = FakeView(*answers)
    return connector, reg


def changes(reg: CollectorRegistry) -> float:
    return reg.get_sample_value("pdorch_store_master_leader_changes_total")


def test_a_master_back_at_the_same_address_with_a_new_term_is_a_switch():
    a1, a2 = Leader("10.0.0.1:50151", 7, 111), Leader("10.0.0.1:50151", 19, 222)
    connector, reg = watching(a1, None, a2)
    connector._watch_leader()
    assert connector.leader == "10.0.0.1:50151" and connector._audit_due is None and changes(reg) == 0
    connector._watch_leader()  # the lease ran out: none leads
    assert reg.get_sample_value("pdorch_store_master_leading") == 0 and connector._audit_due is None
    connector._watch_leader()  # the same address won again: a new term
    assert connector.leader == "10.0.0.1:50151" and connector._audit_due is not None and changes(reg) == 1


def test_a_new_term_seen_without_the_gap_between_is_a_switch_too():
    connector, reg = watching(Leader("a:1", 7, 111), Leader("a:1", 9, 111))  # etcd revision moved on
    connector._watch_leader()
    connector._watch_leader()
    assert changes(reg) == 1 and connector._audit_due is not None


def test_the_same_term_read_again_after_an_etcd_gap_is_no_switch():
    term = Leader("a:1", 7, 111)
    connector, reg = watching(term, None, Leader("a:1", 7, 111))  # None: etcd did not answer one read
    for _ in range(3):
        connector._watch_leader()
    assert changes(reg) == 0 and connector._audit_due is None


def test_another_address_is_a_switch():
    connector, reg = watching(Leader("a:1", 7, 111), Leader("b:1", 12, 333))
    connector._watch_leader()
    connector._watch_leader()
    assert connector.leader == "b:1" and changes(reg) == 1
