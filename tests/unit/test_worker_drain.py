"""WorkerDrain (pdorch/worker/drain.py): its gauges and the bounded write-back wait, with a small fake
worker (the steps themselves run on the real stack: tests/integration/test_local_fleet.py)."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry

from pdorch.config_loader import load_config
from pdorch.worker.drain import WorkerDrain, drain_budget_s


class FakeWorker:
    def __init__(self, in_flight: int, pages: list[int], written_after_polls: int):
        self.in_flight_n, self.pages, self.polls, self.written_after = in_flight, pages, 0, written_after_polls

    def in_flight(self) -> int:
        return self.in_flight_n

    def start_write_back(self) -> list[int]:
        return list(self.pages)

    def write_back_left(self, pages) -> int:
        self.polls += 1
        return 0 if self.polls >= self.written_after else len(pages) - 1


def gauges(registry) -> dict:
    return {(s.name, s.labels.get("kind")): s.value for m in registry.collect() for s in m.samples}


def test_gauges_are_zero_until_the_drain_begins_then_show_what_it_waits_for():
    registry = CollectorRegistry()
    drain = WorkerDrain("decode", FakeWorker(3, [1, 2], 2), registry)
    assert gauges(registry)[("pdorch_worker_draining", None)] == 0
    assert gauges(registry)[("pdorch_worker_drain_remaining", "streams")] == 0
    drain.begin()
    g = gauges(registry)
    assert g[("pdorch_worker_draining", None)] == 1
    assert g[("pdorch_worker_drain_remaining", "streams")] == 3
    assert g[("pdorch_worker_drain_remaining", "prefills")] == 0  # a decode worker runs none
    assert drain.write_back(5.0) == (2, 0)
    assert gauges(registry)[("pdorch_worker_drain_remaining", "writeback_pages")] == 0


def test_the_write_back_wait_ends_at_its_deadline_with_what_is_left():
    registry = CollectorRegistry()
    drain = WorkerDrain("prefill", FakeWorker(1, [1, 2, 3], 10 ** 9), registry)
    drain.begin()
    assert gauges(registry)[("pdorch_worker_drain_remaining", "prefills")] == 1
    t0 = time.monotonic()
    assert drain.write_back(0.3) == (3, 2)
    assert 0.3 <= time.monotonic() - t0 < 2
    assert gauges(registry)[("pdorch_worker_drain_remaining", "writeback_pages")] == 2
    assert drain.write_back(0.0) == (0, 0)  # drain_writeback_s 0: none


def test_drain_budget_covers_both_deadlines_and_the_shutdown():
    cfg = load_config(None, {"decode.drain_timeout_s": "7", "decode.drain_writeback_s": "3",
                             "prefill.drain_timeout_s": "2", "prefill.drain_writeback_s": "4"}, environ={})
    assert drain_budget_s(cfg, "decode") == 7 + 3 + 20
    assert drain_budget_s(cfg, "prefill") == 2 + 4 + 5
