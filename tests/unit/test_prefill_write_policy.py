"""`store.write_policy` in the prefill scheduler (prefill_node/write_policy.py, persistence.py), with the
small fakes of test_prefill_scheduler.py (pure scheduling logic; the real store: the integration test
tests/integration/test_write_policy.py): when each policy writes, what it tells the decode worker,
and the chain depth a write at eviction carries."""

from __future__ import annotations

from dataclasses import replace

from pdorch.config_loader import load_config
from pdorch.worker.metrics import WorkerRecorder
from prefill_node.pusher import KVPusher
from prefill_node.scheduler import PrefillScheduler
from store_client.chain_index import ChainIndex
from store_client.page_hash import page_hashes, store_key
from tests.fixtures.runtime import stand_in_runtime
from tests.unit.test_prefill_scheduler import PAGE_SIZE, FakeRunner, FakeStoreIO, FakeTransfer, settle, submit


def make(num_pages=8, persist_wait_s=None, **store):
    cfg = load_config(None)
    cfg = replace(cfg, store=replace(cfg.store, **store))
    io = FakeStoreIO()
    rt = stand_in_runtime(FakeRunner(), num_pages, PAGE_SIZE, cfg=cfg, store_io=io)
    prefill = replace(cfg.prefill, chunk_tokens=64)
    if persist_wait_s is not None:
        prefill = replace(prefill, persist_wait_s=persist_wait_s)
    sched = PrefillScheduler(rt, prefill, rt.cfg.store,
                             pusher=KVPusher(FakeTransfer(), 100), recorder=WorkerRecorder("prefill"))
    sched.start()
    return sched, rt, io


def keys_of(tokens):
    return [store_key("fp", h) for h in page_hashes(tokens, PAGE_SIZE)]


def test_selective_writes_at_the_use_it_is_set_to():
    tokens = list(range(100, 113))  # 3 full pages, all reusable
    sched, rt, io = make(write_policy="write_through_selective", write_selective_uses=3)
    try:
        for use in (1, 2):
            res = submit(sched, tokens, f"r{use}").future.result(5)
            settle(sched, rt)
            assert io.saved == [], f"written at use {use}"
        assert res.unstored_pages == (0, 1, 2)  # D's prefix cache keeps what P did not write
        submit(sched, tokens, "r3").future.result(5)
        settle(sched, rt)
        assert sorted(io.saved) == sorted(keys_of(tokens))  # the third use: exactly its pages
        assert sched._persist.metrics.written.labels("selective")._value.get() == 3
        assert sched.call(lambda: rt.allocator.num_unpersisted()) == 0
    finally:
        sched.stop()


def test_selective_pages_give_way_without_a_write_or_a_wait():
    # a wait for writes would show as a timeout below
    sched, rt, io = make(num_pages=4, write_policy="write_through_selective", persist_wait_s=30.0)
    try:
        submit(sched, list(range(200, 213)), "a").future.result(5)  # 4 pages: 3 cached, unwritten
        submit(sched, list(range(300, 313)), "b").future.result(5)  # takes a's pages at once
        settle(sched, rt)
        assert io.saved == []
        assert rt.allocator.evicted_unpersisted == {"selective": 3}
        assert sched._persist.metrics.pressure_waits._value.get() == 0
    finally:
        sched.stop()


def test_write_back_defers_every_page_to_its_eviction_with_its_depth():
    sched, rt, io = make(num_pages=4, write_policy="write_back")
    rt.chain_index = ChainIndex(depth_weight_s=60.0, max_pages=100)
    first = list(range(400, 413))
    try:
        res = submit(sched, first, "a").future.result(5)
        submit(sched, first, "a2").future.result(5)  # an L1 hit writes nothing either
        settle(sched, rt)
        assert io.saved == [] and res.unstored_pages == (0, 1, 2)
        for key in keys_of(first):  # a write the evictor tried earlier found the key absent
            rt.chain_index.forget([key])
        submit(sched, list(range(500, 513)), "b").future.result(5)  # a's pages must go: written first
        settle(sched, rt)
        assert sorted(io.saved) == sorted(keys_of(first))
        assert sched._persist.metrics.written.labels("evict")._value.get() == 3
        assert not rt.allocator.evicted_unpersisted  # nothing left L1 unwritten
        # the write at eviction carries each page's depth in its chain, as a write-back would
        assert [rt.chain_index.depth(k) for k in keys_of(first)] == [0, 1, 2]
    finally:
        sched.stop()
