"""Store-aware routing (issue 16, part 3): a prefix resident only in the store goes to the least
loaded prefill worker instead of queueing behind the one the router's L1 index points at.

Real router (in this process), 2 prefill + 1 decode worker processes, mooncake_master, tiny model.
Prefill runs one token per step, so a long prompt keeps a prefill worker busy for seconds.
"""

from __future__ import annotations

import time

import httpx

from pdorch.local_stack.workers import start_cluster
from proto.pdorch.v1 import worker_pb2 as pb
from tests.integration.fault_helpers import prompt, router_workers, start_router

PAGE = 16


def _generate(url: str, ids: list[int], max_new_tokens: int = 2) -> dict:
    r = httpx.post(url + "/generate", timeout=120, json={"input_ids": ids, "sampling_params": {
        "max_new_tokens": max_new_tokens, "temperature": 0.0}})
    assert r.status_code == 200, r.text
    return r.json()["meta_info"]


def _choices(url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("pdorch_router_prefill_choices_total{"):
            out[line.split('reason="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
    return out


def test_a_stored_prefix_goes_to_the_least_loaded_prefill_worker(tmp_path, tiny_model_dir):
    # NOTE: the decode worker's prefix cache off: it would serve turn 2 itself (the store is what is routed on)
    cluster = start_cluster(tmp_path, tiny_model_dir, with_store=True, num_prefill=2, prefill={"chunk_tokens": 1},
                            decode={"prefix_cache": False})
    # NOTE: the guess-based index (what the router falls back to for a stale stream): with KV events
    # the flush below reaches the router, and the long request is store-covered too
    router = start_router(cluster, tiny_model_dir, policy="cache_aware", kv_events=False)
    try:
        conv = prompt(4 * PAGE, seed=3)
        _generate(router.url, conv)  # turn 1: some prefill worker computes it and writes it back
        holder = next(w for w in cluster.workers if w.role == "prefill"
                      and router_workers(router)[w.address]["routed"] == 1)
        other = next(w for w in cluster.workers if w.role == "prefill" and w is not holder)
        cluster.wait_idle("prefill", wp=holder)
        cluster.prefill_stub(holder).Flush(pb.FlushRequest(), timeout=30)  # now only the store holds it

        # A long request with the same prefix: the index sends it to the holder (equal load), where
        # it stays in prefill for seconds (one token per step).
        import threading
        long_done: dict = {}
        long_req = threading.Thread(target=lambda: long_done.update(_generate(router.url, conv + prompt(1200, 7))))
        long_req.start()
        deadline = time.monotonic() + 30
        while router_workers(router)[holder.address]["in_flight"] != 1:
            assert time.monotonic() < deadline, "the long request never reached the holder"
            time.sleep(0.01)

        t0 = time.monotonic()
        turn2 = _generate(router.url, conv + prompt(PAGE, 11))
        elapsed = time.monotonic() - t0
        assert router_workers(router)[holder.address]["in_flight"] == 1, "the long request should still run"
        assert router_workers(router)[other.address]["routed"] == 1, "turn 2 went to the least loaded worker"
        assert turn2["cached_tokens_details"]["store"] >= 4 * PAGE, turn2  # read from the store there
        assert _choices(router.url).get("store_covered") == 1
        long_req.join(120)
        assert long_done, "the long request must finish too"
        print(f"turn 2 served by the other prefill worker in {elapsed:.2f}s with "
              f"{turn2['cached_tokens_details']['store']} tokens from the store")
    finally:
        router.stop()
        cluster.stop()
