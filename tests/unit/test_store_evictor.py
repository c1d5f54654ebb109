"""StoreEvictor logic: the master's /metrics parsing, this worker's share of the deficit, what
happens to removed / absent / leased / failed victims, and the thread's start and stop.
A small fake store and an HTTP server serving metrics text; the real master is in
tests/integration/test_store_eviction.py."""

from __future__ import annotations

import http.server
import threading
import time

import pytest
from prometheus_client import CollectorRegistry

from pdorch.config import StoreConfig
from store_client.chain_index import ChainIndex
from store_client.evictor import (
    MasterFill,
    StoreEvictor,
    master_eviction_counters,
    master_fill,
    master_metrics_url,
    pages_to_remove,
)
from store_client.metrics import StoreMetrics

PAGE = 1000

MASTER_TEXT = """# HELP master_allocated_bytes Total allocated bytes
# TYPE master_allocated_bytes gauge
master_allocated_bytes 90000
master_total_capacity_bytes 100000
segment_allocated_bytes{segment="127.0.0.1:12997"} 90000
master_key_count 90
master_successful_evictions_total 2
master_attempted_evictions_total 3
master_evicted_key_count 38
master_evicted_size_bytes 2490368
"""


def test_parse_the_masters_metrics():
    assert master_fill(MASTER_TEXT) == MasterFill(90000.0, 100000.0, 90.0)
    assert master_fill(MASTER_TEXT).ratio == 0.9
    assert master_fill("master_key_count 3\n") is None
    assert master_eviction_counters(MASTER_TEXT) == {"evicted_keys": 38.0, "evicted_bytes": 2490368.0,
                                                     "eviction_runs": 2.0, "eviction_attempts": 3.0}
    assert master_eviction_counters("") == {}


def test_master_metrics_url():
    cfg = StoreConfig(master_address="10.0.0.7:50151", master_metrics_port=9103)
    assert master_metrics_url(cfg) == "http://10.0.0.7:9103/metrics"


def test_share_of_the_deficit():
    fill = MasterFill(allocated_bytes=90_000, capacity_bytes=100_000, key_count=90)
    # down to 0.8: 10_000 bytes = 10 pages; this worker knows all 90 keys
    assert pages_to_remove(fill, 90, PAGE, 0.8) == 10
    assert pages_to_remove(fill, 45, PAGE, 0.8) == 5  # another worker knows the other half
    assert pages_to_remove(fill, 1, PAGE, 0.8) == 1  # rounds up
    assert pages_to_remove(fill, 200, PAGE, 0.8) == 10  # an index knowing more than the master (stale keys)
    assert pages_to_remove(fill, 90, PAGE, 0.95) == 0
    assert pages_to_remove(fill, 0, PAGE, 0.8) == 0


class FakeStore:
    """remove_many answers from `codes` (key -> code, default 0) and records its calls."""

    def __init__(self):
        self.page_nbytes = PAGE
        self.registry = CollectorRegistry()
        self.metrics = StoreMetrics(self.registry)
        self.enabled = True
        self.codes: dict[str, int] = {}
        self.calls: list[list[str]] = []

    def remove_many(self, keys):
        self.calls.append(list(keys))
        return [self.codes.get(k, 0) for k in keys]

    def metric(self, name, **labels) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


class MetricsServer:
    def __init__(self):
        self.text = MASTER_TEXT
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = owner.text.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def server():
    s = MetricsServer()
    yield s
    s.close()


def _cfg(**kw) -> StoreConfig:
    base = {"evict_high_watermark": 0.85, "evict_low_watermark": 0.8, "evict_interval_s": 0.05}
    return StoreConfig(**{**base, **kw})


def _index_of_90_pages() -> ChainIndex:
    clock = iter(range(1000))
    idx = ChainIndex(1000, depth_weight_s=1.0, clock=lambda: 100.0 * next(clock))
    for c in range(9):  # 9 chains of 10 pages, chain c touched at t=100*c
        idx.touch([f"c{c}p{i}" for i in range(10)])
    return idx


def test_run_once_removes_this_workers_share_tails_of_old_chains_first(server):
    store, idx = FakeStore(), _index_of_90_pages()
    ev = StoreEvictor(store, idx, _cfg(), server.url)
    store.codes = {"c0p8": -704, "c0p7": -706, "c0p6": -900}  # absent, leased, failed
    assert ev.run_once() == 7  # deficit 10 pages: 7 removed, 1 already gone, 1 leased, 1 failed
    assert store.calls == [[f"c0p{i}" for i in range(9, -1, -1)]]  # chain 0 (oldest), deepest first
    assert len(idx) == 90 - 8  # removed and absent forgotten; leased and failed kept
    assert idx.depth("c0p7") == 7 and idx.depth("c0p6") == 6
    assert store.metric("pdorch_store_evicted_pages_total") == 7
    assert [store.metric("pdorch_store_evict_skipped_pages_total", reason=r)
            for r in ("absent", "leased", "failed")] == [1, 1, 1]
    assert store.metric("pdorch_store_fill_ratio") == 0.9
    assert store.metric("pdorch_store_chain_index_pages") == 82
    # The leased page was refreshed (just read): the next pass offers the failed one first.
    store.calls.clear()
    ev.run_once()
    assert store.calls[0][:2] == ["c0p6", "c1p9"] and "c0p7" not in store.calls[0][:10]


def test_leased_victims_are_passed_over_within_a_pass(server):
    server.text = MASTER_TEXT.replace("master_key_count 90", "master_key_count 30")
    store = FakeStore()
    idx = ChainIndex(1000, depth_weight_s=1.0, clock=lambda: 0.0)  # a refresh changes nothing here
    keys = [f"p{i}" for i in range(30)]
    idx.touch(keys)
    store.codes = {k: -706 for k in keys[20:]}  # a reader holds the 10 deepest pages
    assert StoreEvictor(store, idx, _cfg(), server.url).run_once() == 10
    assert store.calls == [keys[29:19:-1], keys[19:9:-1]]
    assert len(idx) == 20 and store.metric("pdorch_store_evict_skipped_pages_total", reason="leased") == 10


def test_run_once_below_the_watermark_or_without_metrics_removes_nothing(server):
    store, idx = FakeStore(), _index_of_90_pages()
    ev = StoreEvictor(store, idx, _cfg(evict_high_watermark=0.95, evict_low_watermark=0.9), server.url)
    assert ev.run_once() == 0 and store.calls == []
    assert store.metric("pdorch_store_fill_ratio") == 0.9
    server.text = "garbage\n"
    ev = StoreEvictor(store, idx, _cfg(), server.url)
    assert ev.run_once() == 0 and store.calls == []
    assert store.metric("pdorch_store_master_metrics_failures_total") == 1
    ev = StoreEvictor(store, idx, _cfg(), "http://127.0.0.1:1/metrics")  # nothing listens there
    assert ev.run_once() == 0
    assert store.metric("pdorch_store_master_metrics_failures_total") == 2
    store.enabled = False  # disabled: not even the master is asked
    assert ev.run_once() == 0
    assert store.metric("pdorch_store_master_metrics_failures_total") == 2


def test_watermarks_must_be_ordered(server):
    with pytest.raises(ValueError, match="evict_low_watermark"):
        StoreEvictor(FakeStore(), _index_of_90_pages(), _cfg(evict_low_watermark=0.9), server.url)


def test_thread_evicts_every_interval_and_stops(server):
    store, idx = FakeStore(), _index_of_90_pages()
    ev = StoreEvictor(store, idx, _cfg(evict_interval_s=0.02), server.url).start()
    try:
        deadline = time.monotonic() + 5
        while len(store.calls) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(store.calls) >= 2  # the fake master stays 90% full: every pass removes 10 more
    finally:
        t0 = time.monotonic()
        ev.stop(timeout_s=2)
        assert time.monotonic() - t0 < 1.0
    assert not ev._thread.is_alive()
    with pytest.raises(RuntimeError):
        ev.start()


def test_make_room_removes_before_a_burst_of_writes_would_pass_the_high_watermark(server):
    store, idx = FakeStore(), _index_of_90_pages()
    server.text = MASTER_TEXT.replace("master_allocated_bytes 90000", "master_allocated_bytes 70000")
    ev = StoreEvictor(store, idx, _cfg(), server.url, fresh_s=float("inf"))  # the estimate alone
    assert ev.make_room(50) == 0  # no fill read yet: nothing to act on
    assert ev.run_once() == 0  # 0.70 full: below the high watermark
    assert ev.make_room(10) == 0  # 0.70 + 10 pages = 0.80: fits
    # 0.80 + 10 pages = 0.90 > 0.85: first remove down to 0.80 with the new pages, 10 pages
    assert ev.make_room(10) == 10
    assert store.calls == [[f"c0p{i}" for i in range(9, -1, -1)]]
    assert ev.make_room(1) == 0  # the estimate now counts the removal: 0.81


def test_make_room_reads_the_master_again_and_sees_the_other_writers_pages(server):
    store, idx = FakeStore(), _index_of_90_pages()
    server.text = MASTER_TEXT.replace("master_allocated_bytes 90000", "master_allocated_bytes 70000")
    ev = StoreEvictor(store, idx, _cfg(), server.url, fresh_s=0.0)  # read before every write
    assert ev.make_room(10) == 0  # read at once (no pass yet): 0.70 + 10 pages = 0.80 fits
    # Another worker wrote 10 pages meanwhile: the master says 0.80, so 10 more would reach 0.90.
    # Counting only its own writes this worker would believe 0.80 and write into the master's eviction.
    server.text = MASTER_TEXT.replace("master_allocated_bytes 90000", "master_allocated_bytes 80000")
    assert ev.make_room(10) == 10
    assert store.calls == [[f"c0p{i}" for i in range(9, -1, -1)]]
    stale = StoreEvictor(FakeStore(), _index_of_90_pages(), _cfg(), server.url, fresh_s=float("inf"))
    server.text = MASTER_TEXT.replace("master_allocated_bytes 90000", "master_allocated_bytes 70000")
    stale.run_once()
    server.text = MASTER_TEXT.replace("master_allocated_bytes 90000", "master_allocated_bytes 80000")
    assert stale.make_room(10) == 0  # the control: without reading again it misses the other writer


def test_should_write_skips_pages_eviction_would_remove_at_once(server):
    store, idx = FakeStore(), _index_of_90_pages()
    server.text = MASTER_TEXT.replace("master_allocated_bytes 90000", "master_allocated_bytes 70000")
    ev = StoreEvictor(store, idx, _cfg(), server.url, fresh_s=float("inf"))
    assert ev.should_write(10**6, 50)  # no fill read yet, no cutoff: write
    ev.run_once()
    assert ev.make_room(10) == 0 and ev.make_room(10) == 10  # removes chain 0: the cutoff is its head's priority
    assert ev.cutoff == 0.0  # chain 0 was touched at t=0; its head (depth 0) ranked highest of what left
    assert ev.should_write(10**6, 5)  # room below the high watermark (0.80 + 5 pages): write anything
    assert ev.should_write(0, 6)  # full, but a head touched now outranks the water level
    assert not ev.should_write(10**6, 6)  # full, and so deep it would be the next victim: skip


def test_stale_pages_leave_first_and_do_not_raise_the_water_level(server):
    now = [0.0]
    idx = ChainIndex(1000, depth_weight_s=60.0, clock=lambda: now[0])
    idx.touch([f"dead{i}" for i in range(10)])  # a conversation that ended at t=0
    for i in range(8):  # live conversations come back every 10 s: stale after 20 s
        now[0] = 100.0 + 10 * i
        idx.touch([f"live{i}p{d}" for d in range(10)], lookup=True)
        now[0] += 10
        idx.touch([f"live{i}p{d}" for d in range(10)], lookup=True)
    for i in range(7):  # 80 pages are known; fill 90%: a deficit of 10 pages
        idx.touch([f"more{i}p0"])
    store = FakeStore()
    ev = StoreEvictor(store, idx, _cfg(), server.url)
    assert ev.run_once() == 10
    assert store.calls == [[f"dead{i}" for i in range(10)]]  # by depth weight alone: the live tails
    assert ev.cutoff is None  # a stale head says nothing about what the live chains can afford
    assert ev.should_write(20, 1)
    samples = {s.name: s.value for m in store.registry.collect() for s in m.samples}
    assert samples["pdorch_store_evicted_stale_pages_total"] == 10
    assert samples["pdorch_store_stale_after_seconds"] == pytest.approx(20.0)
