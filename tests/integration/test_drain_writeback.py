"""A draining prefill worker writes back every L1 page the store lacks, however many: against a real
mooncake_master and real workers (pdorch/worker/drain.py, pdorch/worker/drain_writes.py).

The store I/O queue drops a save past `store.max_pending_save_pages` whole. A drain that wrote its L1
in one save lost all of it once the L1 held more than that (the default budget is 256 pages, a
prefill L1 512 by default), and logged it as written. Here the budget is 8 pages and the worker's L1
holds 24 the store lacks (store.write_policy write_back: nothing is written at compute time); the
worker contributes no segment (global_segment_size_mb 0), so what it wrote stays after it exits.
"""

from __future__ import annotations

import random
import signal

import pytest
from prometheus_client import CollectorRegistry

from pdorch.local_stack.store import model_page_objects, store_config
from pdorch.local_stack.workers import start_cluster
from pdorch.worker.prompt_pages import reusable_pages
from proto.pdorch.v1 import worker_pb2 as pb
from store_client.metrics import StoreMetrics
from store_client.page_hash import page_hashes, store_key
from store_client.store import KVStore

PAGE_SIZE = 16
PROMPTS = 6  # 4 reusable pages each: 24 pages, 3 x the queue's budget
BUDGET = 8


@pytest.fixture
def cluster(tmp_path, tiny_model_dir):
    c = start_cluster(tmp_path, tiny_model_dir, with_store=True,
                      decode={"prefix_cache": False, "offload_generated_kv": False, "max_local_prefill_tokens": 0,
                              "load_prefix_from_store": False})
    try:
        yield c
    finally:
        c.stop()


def test_a_drain_writes_back_an_l1_larger_than_the_io_queues_budget(cluster, tiny_model_dir):
    wp = cluster.spawn_worker("prefill", num_pages=64, sections={"store": {
        "write_policy": "write_back", "max_pending_save_pages": BUDGET, "global_segment_size_mb": 0}})
    cluster.wait_ready(wp)
    objects = model_page_objects(tiny_model_dir)
    store = KVStore(store_config(cluster.master, global_segment_size_mb=0), objects.page_nbytes,
                    StoreMetrics(CollectorRegistry()), objects=objects)
    try:
        assert store.wait_enabled(60), "the test's store client did not connect"
        fingerprint = cluster.prefill_stub(wp).Info(pb.InfoRequest(), timeout=10).model_fingerprint
        rng = random.Random(7)
        keys = []
        for _ in range(PROMPTS):
            tokens = [rng.randrange(5, 250) for _ in range(4 * PAGE_SIZE + 5)]
            cluster.generate(tokens, max_tokens=2, prefill_address=wp.address)
            keys += [store_key(fingerprint, h)
                     for h in page_hashes(tokens, PAGE_SIZE)[:reusable_pages(len(tokens), PAGE_SIZE)]]
        cluster.wait_idle("prefill", wp=wp)
        assert len(keys) == 3 * BUDGET
        assert not any(store.present(keys)), "write_back wrote at compute time"

        wp.proc.send_signal(signal.SIGTERM)
        assert wp.proc.wait(timeout=60) == 0, wp.log_tail()
        log = wp.log_path.read_text(errors="replace")
        assert f"drain: wrote {len(keys)} of the {len(keys)} L1 pages" in log, wp.log_tail()
        assert all(store.present(keys)), (store.present(keys), wp.log_tail())
    finally:
        store.close()
