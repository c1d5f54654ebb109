"""`store.write_policy` (prefill_node/write_policy.py) against a real mooncake_master and real workers:
each policy writes exactly the pages it promises, counted both by the prefill worker's metrics and
by the store's keys (one `batch_is_exist` through `KVStore.present`).

One cluster, three prefill workers (one per policy, a 10-page L1 each) and one decode worker that
writes nothing and reads nothing itself (no prefix cache, no offload, no local prefill, no store
read), so every store page comes from the prefill worker under test. The same request sequence on
each, with prompts of its own (page size 16; "4+" = 4 full pages and 5 tokens):

    1. A (4+)   2. A again (L1 hit)   3. B (4+)   4. E (8+: L1 gives up 7 of A's and B's pages)
    5. A again (L1 gave up E's pages; A comes back from the store: `store` cached tokens, same output)
"""

from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry

from pdorch.local_stack.store import model_page_objects, store_config
from pdorch.local_stack.workers import start_cluster, worker_metric
from pdorch.worker.prompt_pages import reusable_pages
from proto.pdorch.v1 import worker_pb2 as pb
from store_client.metrics import StoreMetrics
from store_client.page_hash import page_hashes, store_key
from store_client.store import KVStore

PAGE_SIZE = 16
POLICIES = ("write_through", "write_through_selective", "write_back")
WRITTEN = "pdorch_prefill_store_policy_written_pages_total"
DROPPED = "pdorch_prefill_l1_dropped_unpersisted_pages_total"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, tiny_model_dir):
    c = start_cluster(tmp_path_factory.mktemp("write_policy"), tiny_model_dir, with_store=True,
                      prefill={"num_pages": 10},
                      decode={"prefix_cache": False, "offload_generated_kv": False, "max_local_prefill_tokens": 0,
                              "load_prefix_from_store": False})
    try:
        workers = {"write_through": c.prefill}
        for policy in POLICIES[1:]:
            workers[policy] = c.spawn_worker("prefill", sections={"store": {"write_policy": policy}})
        c.wait_ready(*workers.values())
        c.policy_workers = workers
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def store(cluster, tiny_model_dir):
    objects = model_page_objects(tiny_model_dir)  # present(): every object of each page
    kv = KVStore(store_config(cluster.master, global_segment_size_mb=0), objects.page_nbytes,
                 StoreMetrics(CollectorRegistry()), objects=objects)
    assert kv.wait_enabled(60), "the test's store client did not connect"
    yield kv
    kv.close()


def prompt(rng: random.Random, full_pages: int) -> list[int]:
    return [rng.randrange(5, 250) for _ in range(full_pages * PAGE_SIZE + 5)]


def run_sequence(cluster, store, policy: str) -> dict:
    """The sequence of the module docstring on `policy`'s prefill worker; what it wrote, step by step."""
    wp = cluster.policy_workers[policy]
    rng = random.Random(POLICIES.index(policy))
    a, b, e = prompt(rng, 4), prompt(rng, 4), prompt(rng, 8)
    fingerprint = cluster.prefill_stub(wp).Info(pb.InfoRequest(), timeout=10).model_fingerprint

    def keys(tokens):
        return [store_key(fingerprint, h) for h in page_hashes(tokens, PAGE_SIZE)[:reusable_pages(len(tokens), PAGE_SIZE)]]

    def step(tokens):
        out = cluster.generate(tokens, max_tokens=4, prefill_address=wp.address)
        cluster.wait_idle("prefill", wp=wp)  # its store writes are done (they hold the pages)
        return out

    seen = {}
    first = step(a)
    seen["a_after_1"] = store.present(keys(a))
    step(a)
    seen["a_after_2"] = store.present(keys(a))
    step(b)
    seen["b_after_3"] = store.present(keys(b))
    step(e)
    seen["b_after_4"] = store.present(keys(b))
    again = step(a)
    seen["a_after_5"] = store.present(keys(a))
    seen["e_after_5"] = store.present(keys(e))
    seen["same_output"] = again.token_ids == first.token_ids
    seen["store_tokens_5"] = again.cached.store
    seen["written"] = {r: worker_metric(wp, WRITTEN, reason=r) for r in ("computed", "selective", "backfill", "evict")}
    seen["dropped"] = {r: worker_metric(wp, DROPPED, reason=r) for r in ("selective", "deferred")}
    st = cluster.wait_idle("prefill", wp=wp)
    assert st.pool_integrity_ok, st.pool_integrity_error
    print(f"{policy}: written {seen['written']}, dropped unwritten {seen['dropped']}")
    return seen


def test_write_through_writes_every_computed_page_at_compute_time(cluster, store):
    seen = run_sequence(cluster, store, "write_through")
    assert all(seen["a_after_1"]) and all(seen["b_after_3"])
    assert seen["written"] == {"computed": 16, "selective": 0, "backfill": 0, "evict": 0}  # A4 + B4 + E8
    assert all(seen["e_after_5"])
    assert seen["same_output"] and seen["store_tokens_5"] == 4 * PAGE_SIZE


def test_selective_writes_a_page_at_its_second_use_only(cluster, store):
    seen = run_sequence(cluster, store, "write_through_selective")
    assert seen["a_after_1"] == (False,) * 4  # used once: not written
    assert seen["a_after_2"] == (True,) * 4  # the L1 hit was its second use: written, exactly A's pages
    assert seen["b_after_4"] == (False,) * 4 and seen["e_after_5"] == (False,) * 8  # one-off prompts never
    assert seen["written"] == {"computed": 0, "selective": 4, "backfill": 0, "evict": 0}
    # L1 gave up 3 of B's and 4 of E's pages unwritten, counted as a loss by policy
    assert seen["dropped"]["selective"] == 7
    assert seen["same_output"] and seen["store_tokens_5"] == 4 * PAGE_SIZE


def test_write_back_writes_pages_only_as_l1_gives_them_up(cluster, store):
    seen = run_sequence(cluster, store, "write_back")
    assert seen["a_after_1"] == (False,) * 4 and seen["a_after_2"] == (False,) * 4  # nothing at compute time
    assert seen["b_after_3"] == (False,) * 4
    # step 4 took 7 of the 8 cached pages (A's 4, then B's from the tail): each written first
    assert seen["b_after_4"] == (False, True, True, True)
    assert seen["a_after_5"] == (True,) * 4
    # step 5 took B's last page and 3 of E's (again from the tail): written as they left
    assert seen["e_after_5"] == (False,) * 5 + (True,) * 3
    assert seen["written"] == {"computed": 0, "selective": 0, "backfill": 0, "evict": 11}
    assert seen["dropped"]["deferred"] == 0  # nothing left L1 unwritten
    assert seen["same_output"] and seen["store_tokens_5"] == 4 * PAGE_SIZE
