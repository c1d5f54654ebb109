"""Store writes larger than the store I/O queue's budget (`store.max_pending_save_pages`, 8 pages here)
reach the store, against a real mooncake_master and real workers; each worker under test contributes no
segment (global_segment_size_mb 0), so what it wrote stays after it exits.

- A draining prefill worker writes back every L1 page the store lacks (pdorch/worker/drain.py,
  pdorch/worker/drain_writes.py): 24 pages (store.write_policy write_back: nothing is written at compute
  time). Its drain wrote them in one save, which the queue dropped whole (the default budget is 256
  pages, a prefill L1 512), and logged them as written.
- A prompt of 12 reusable pages is written through (store_client/io_thread.py): a save larger than the
  whole budget was dropped even on an empty queue, so no prompt longer than the budget (4096 tokens at
  the defaults) reached the store by its write-through.
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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, tiny_model_dir):
    c = start_cluster(tmp_path_factory.mktemp("write_budget"), tiny_model_dir, with_store=True,
                      decode={"prefix_cache": False, "offload_generated_kv": False, "max_local_prefill_tokens": 0,
                              "load_prefix_from_store": False})
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def store(cluster, tiny_model_dir):
    objects = model_page_objects(tiny_model_dir)
    kv = KVStore(store_config(cluster.master, global_segment_size_mb=0), objects.page_nbytes,
                 StoreMetrics(CollectorRegistry()), objects=objects)
    try:
        assert kv.wait_enabled(60), "the test's store client did not connect"
        yield kv
    finally:
        kv.close()


def prefill_worker(cluster, **store_keys):
    wp = cluster.spawn_worker("prefill", num_pages=64, sections={"store": {
        "max_pending_save_pages": BUDGET, "global_segment_size_mb": 0, **store_keys}})
    cluster.wait_ready(wp)
    return wp, cluster.prefill_stub(wp).Info(pb.InfoRequest(), timeout=10).model_fingerprint


def run_prompt(cluster, wp, fingerprint: str, rng: random.Random, full_pages: int) -> list[str]:
    """One request on `wp`; the store keys of its reusable pages."""
    tokens = [rng.randrange(5, 250) for _ in range(full_pages * PAGE_SIZE + 5)]
    cluster.generate(tokens, max_tokens=2, prefill_address=wp.address)
    return [store_key(fingerprint, h) for h in page_hashes(tokens, PAGE_SIZE)[:reusable_pages(len(tokens), PAGE_SIZE)]]


def test_a_drain_writes_back_an_l1_larger_than_the_io_queues_budget(cluster, store):
    wp, fingerprint = prefill_worker(cluster, write_policy="write_back")
    rng = random.Random(7)
    keys = [k for _ in range(PROMPTS) for k in run_prompt(cluster, wp, fingerprint, rng, 4)]
    cluster.wait_idle("prefill", wp=wp)
    assert len(keys) == 3 * BUDGET
    assert not any(store.present(keys)), "write_back wrote at compute time"

    wp.proc.send_signal(signal.SIGTERM)
    assert wp.proc.wait(timeout=60) == 0, wp.log_tail()
    log = wp.log_path.read_text(errors="replace")
    assert f"drain: wrote {len(keys)} of the {len(keys)} L1 pages" in log, wp.log_tail()
    assert all(store.present(keys)), (store.present(keys), wp.log_tail())


def test_a_prompt_longer_than_the_io_queues_budget_is_written_through(cluster, store):
    wp, fingerprint = prefill_worker(cluster, write_policy="write_through")
    keys = run_prompt(cluster, wp, fingerprint, random.Random(3), 12)
    cluster.wait_idle("prefill", wp=wp)  # its write is over (the task holds its pages until then)
    assert len(keys) == 12 > BUDGET
    assert all(store.present(keys)), store.present(keys)
