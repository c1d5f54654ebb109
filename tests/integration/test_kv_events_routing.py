"""The router's index from the workers' KV events (issue 27, acceptance a-c): real prefill and decode
worker processes (tiny model, store off: only the workers' own caches decide), real routers in this
process subscribing to their WatchKV streams.

    (a) a router started after the traffic learns the prefixes from snapshots and routes the next
        turn to the worker that holds it
    (b) a prefill worker's L1 flush reaches the router's index within 1 s
    (c) a prefill worker killed and restarted is a new epoch: its old pages leave the index
"""

from __future__ import annotations

import signal
import threading
import time

import grpc
import httpx
import pytest

from pdorch.local_stack.workers import start_cluster
from proto.pdorch.v1 import worker_pb2 as pb
from store_client.page_hash import HASH_SCHEME, KV_LAYOUT_VERSION
from tests.integration.fault_helpers import prompt, router_workers, start_router

PAGE = 16
TURN1_PAGES = 6


def _generate(url: str, ids: list[int]) -> dict:
    r = httpx.post(url + "/generate", timeout=120, json={"input_ids": ids, "sampling_params": {
        "max_new_tokens": 2, "temperature": 0.0}})
    assert r.status_code == 200, r.text
    return r.json()["meta_info"]


def _metric(url: str, name: str) -> dict[str, float]:
    """label text -> value of one metric family in the router's /metrics."""
    out = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith((name + "{", name + " ")):
            labels, _, value = line.rpartition(" ")
            out[labels[len(name):]] = float(value)
    return out


def _index_pages(url: str, address: str) -> float:
    return _metric(url, "pdorch_router_kv_index_pages").get(f'{{worker="{address}"}}', 0.0)


def _wait(what: str, cond, timeout_s: float = 20.0, step_s: float = 0.02) -> float:
    """Seconds until cond() holds; fails naming `what` after timeout_s."""
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout_s, f"{what} within {timeout_s} s"
        time.sleep(step_s)
    return time.monotonic() - t0


def _all_live(router) -> bool:
    return all((w.get("kv_events") or {}).get("state") == "live" for w in router_workers(router).values())


@pytest.fixture
def cluster(tmp_path, tiny_model_dir):
    # NOTE: the decode worker's prefix cache off, or it would serve every later turn itself
    c = start_cluster(tmp_path, tiny_model_dir, with_store=False, num_prefill=2, decode={"prefix_cache": False})
    yield c
    c.stop()


def test_a_late_router_learns_the_prefixes_from_snapshots_and_routes_to_the_holder(cluster, tiny_model_dir):
    guess = start_router(cluster, tiny_model_dir, policy="round_robin", kv_events=False)
    convs = [prompt(TURN1_PAGES * PAGE + 3, seed=s) for s in (1, 2)]
    try:
        for conv in convs:  # round robin: one conversation on each prefill worker
            _generate(guess.url, conv)
        routed = {a: w["routed"] for a, w in router_workers(guess).items() if w["role"] == "prefill"}
        assert sorted(routed.values()) == [1, 1], routed
    finally:
        guess.stop()
    prefills = sorted(w.address for w in cluster.workers if w.role == "prefill")
    late = start_router(cluster, tiny_model_dir, policy="cache_aware")
    try:
        _wait("every worker's KV event stream live in the late router", lambda: _all_live(late))
        holders = {}
        for address in prefills:
            assert _index_pages(late.url, address) >= TURN1_PAGES, "the snapshot carries the worker's L1"
        for conv in convs:
            before = {a: w["routed"] for a, w in router_workers(late).items()}
            meta = _generate(late.url, conv + prompt(PAGE, seed=9))
            after = {a: w["routed"] for a, w in router_workers(late).items()}
            (chosen,) = [a for a in prefills if after[a] > before.get(a, 0)]
            holders[chosen] = meta
            assert meta["cached_tokens_details"]["device"] == TURN1_PAGES * PAGE, (chosen, meta)
        assert len(holders) == 2, "each conversation went to the worker holding it"
        assert _metric(late.url, "pdorch_router_prefill_choices_total").get('{reason="prefix_match"}') == 2
    finally:
        late.stop()


def test_an_l1_flush_reaches_the_index_within_a_second(cluster, tiny_model_dir):
    router = start_router(cluster, tiny_model_dir, policy="cache_aware")
    try:
        _wait("KV event streams live", lambda: _all_live(router))
        _generate(router.url, prompt(TURN1_PAGES * PAGE + 3, seed=4))
        holder = next(a for a, w in router_workers(router).items() if w["role"] == "prefill" and w["routed"])
        _wait("the turn's pages in the index", lambda: _index_pages(router.url, holder) >= TURN1_PAGES)
        wp = next(w for w in cluster.workers if w.address == holder)
        cluster.wait_idle("prefill", wp=wp)
        cluster.prefill_stub(wp).Flush(pb.FlushRequest(), timeout=30)
        elapsed = _wait("the flush in the index", lambda: _index_pages(router.url, holder) == 0, timeout_s=5)
        assert elapsed < 1.0, f"the flush took {elapsed:.2f} s to reach the index"
    finally:
        router.stop()


def test_a_restarted_worker_is_a_new_epoch_and_its_old_pages_leave_the_index(cluster, tiny_model_dir):
    router = start_router(cluster, tiny_model_dir, policy="cache_aware")
    try:
        _wait("KV event streams live", lambda: _all_live(router))
        _generate(router.url, prompt(TURN1_PAGES * PAGE + 3, seed=5))
        holder = next(a for a, w in router_workers(router).items() if w["role"] == "prefill" and w["routed"])
        _wait("the turn's pages in the index", lambda: _index_pages(router.url, holder) >= TURN1_PAGES)
        old = next(w for w in cluster.workers if w.address == holder)
        snapshots = router_workers(router)[holder]["kv_events"]["snapshots"]
        old.proc.send_signal(signal.SIGKILL)
        old.proc.wait(30)
        cluster.workers.remove(old)
        new = cluster.spawn_worker("prefill", port=old.port)
        cluster.wait_ready(new)
        _wait("a snapshot of the new epoch", lambda: router_workers(router)[holder]["kv_events"]["snapshots"]
              > snapshots and router_workers(router)[holder]["kv_events"]["state"] == "live", timeout_s=30)
        assert _index_pages(router.url, holder) == 0, "the old epoch's pages are gone"
    finally:
        router.stop()


def test_a_store_eviction_reaches_the_index_within_a_second(tmp_path, tiny_model_dir):
    """The prefill worker's chain evictor removes pages while traffic runs; a subscriber of our own
    sees each store_removed batch, and every removed page must have left the router's index (its
    store run) within 1 s of that batch."""
    # 2 x 16 MiB of store (P's and D's segments) = 4,096 tiny-model pages (8 KiB); chain eviction from
    # 5 % full (~200 pages) down to 3 %
    store = {"global_segment_size_mb": 16, "evict_high_watermark": 0.05, "evict_low_watermark": 0.03}
    cluster = start_cluster(tmp_path, tiny_model_dir, with_store=True, num_prefill=1, store=store,
                            decode={"prefix_cache": False}, kv_lease_ttl_ms=200)
    router = None
    removed: dict[str, float] = {}  # hash -> when our own subscriber saw it removed
    rewritten: set[str] = set()
    stop = threading.Event()

    def watch():
        req = pb.WatchKVRequest(hash_scheme=HASH_SCHEME, page_size=PAGE, layout_version=KV_LAYOUT_VERSION)
        call = cluster.prefill_stub().WatchKV(req, timeout=120)
        try:
            for batch in call:
                now = time.monotonic()
                rewritten.update(h for h in batch.store_written if h in removed)
                for h in batch.store_removed:
                    removed.setdefault(h, now)
                if stop.is_set():
                    break
        except grpc.RpcError:
            pass  # the cluster stopping ends the stream
        finally:
            call.cancel()

    watcher = threading.Thread(target=watch, daemon=True)
    try:  # everything after the cluster's start: a failure anywhere still stops it
        router = start_router(cluster, tiny_model_dir, policy="cache_aware")
        index = router.app.state.kv_watcher.index
        _wait("KV event streams live", lambda: _all_live(router))
        watcher.start()
        traffic = threading.Thread(target=lambda: [_generate(router.url, prompt(110 * PAGE + 3, seed=seed))
                                                   for seed in (8, 9, 10)])
        traffic.start()
        left: dict[str, float] = {}  # hash -> when the router's index no longer held it
        deadline = time.monotonic() + 90
        # NOTE: the evictor runs every store.evict_interval_s from the master's metrics: under load its first
        # pass can come after the traffic ended, so the watch also waits for a first removal (a whole-suite
        # run two files at a time once ended here with nothing removed yet)
        while (traffic.is_alive() or not removed or len(left) < len(removed)) and time.monotonic() < deadline:
            now = time.monotonic()
            for h, t in list(removed.items()):
                if h not in left and index.store_run([h]) == 0:
                    left[h] = now
            time.sleep(0.02)
        traffic.join(120)
        stop.set()
        # what the run saw, in every failure message (a failure seen once in a whole-suite run said only which line)
        seen = (f"traffic done: {not traffic.is_alive()}, removed {len(removed)}, left the index {len(left)}, "
                f"rewritten after removal {len(rewritten)}, {time.monotonic() - deadline + 90:.1f} s watched")
        assert removed, f"the chain evictor removed nothing ({seen})"
        lags = sorted(left[h] - removed[h] for h in removed if h in left and h not in rewritten)
        missing = [h for h in removed if h not in left and h not in rewritten]
        assert not missing, f"{len(missing)} removed pages still in the router's index ({seen})"
        assert lags[-1] < 1.0, (f"a removal reached the index {lags[-1]:.2f} s after the worker published it "
                                f"(p50 {lags[len(lags) // 2]:.3f} s; {seen})")
        print(f"{len(lags)} removals, index lag p50 {lags[len(lags) // 2] * 1000:.0f} ms, max {lags[-1] * 1000:.0f} ms")
    finally:
        stop.set()
        if router is not None:
            router.stop()
        cluster.stop()


def test_the_next_turn_goes_to_the_decode_worker_whose_own_cache_holds_the_conversation(tmp_path, tiny_model_dir):
    cluster = start_cluster(tmp_path, tiny_model_dir, with_store=False, num_prefill=1)
    cluster.wait_ready(cluster.spawn_worker("decode"))
    router = start_router(cluster, tiny_model_dir, policy="cache_aware")
    decodes = [w.address for w in cluster.workers if w.role == "decode"]
    try:
        _wait("KV event streams live", lambda: _all_live(router))
        for seed in (11, 12, 13, 14):
            conv = prompt(TURN1_PAGES * PAGE + 3, seed=seed)
            before = {a: router_workers(router)[a]["routed"] for a in decodes}
            _generate(router.url, conv)
            mid = {a: router_workers(router)[a]["routed"] for a in decodes}
            (first,) = [a for a in decodes if mid[a] > before[a]]
            _wait("the turn's pages in its decode worker's entry",
                  lambda first=first: _index_pages(router.url, first) >= TURN1_PAGES)
            meta = _generate(router.url, conv + prompt(PAGE, seed=seed + 50))
            after = {a: router_workers(router)[a]["routed"] for a in decodes}
            (second,) = [a for a in decodes if after[a] > mid[a]]
            assert second == first, f"turn 2 of conversation {seed} went to the other decode worker"
            assert meta["cached_tokens_details"]["device"] >= TURN1_PAGES * PAGE, meta
        # A new conversation while one decode worker is busy goes to the other (load-aware). NOTE: not
        # "sequential new conversations spread": idle ties are settled by a hash of the prompt against
        # each worker's address (replicas agree), and the ports are random, so 4 prompts can all land
        # on one of 2 workers.
        # NOTE: the load the router weighs includes what each worker last published; a request that
        # ended counts until its worker's next batch (the next cut since the load is published on change)
        _wait("both decode workers' published load back to 0",
              lambda: all(router_workers(router)[a]["kv_events"]["published_load"] == 0 for a in decodes))
        busy_prompt = prompt(TURN1_PAGES * PAGE + 3, seed=90)
        long = threading.Thread(target=lambda: httpx.post(router.url + "/generate", timeout=120, json={
            "input_ids": busy_prompt, "sampling_params": {"max_new_tokens": 1500, "temperature": 0.0,
                                                          "ignore_eos": True}}))
        before = {a: router_workers(router)[a]["routed"] for a in decodes}
        long.start()
        try:
            _wait("the long request on a decode worker",
                  lambda: any(router_workers(router)[a]["in_flight"] for a in decodes))
            busy = {a for a in decodes if router_workers(router)[a]["in_flight"]}
            mid = {a: router_workers(router)[a]["routed"] for a in decodes}
            _generate(router.url, prompt(TURN1_PAGES * PAGE + 3, seed=91))
            after = {a: router_workers(router)[a]["routed"] for a in decodes}
            assert len(busy) == 1 and sum(mid.values()) == sum(before.values()) + 1, (before, mid)
            (new,) = [a for a in decodes if after[a] > mid[a]]
            assert new not in busy, "a new conversation went to the busy decode worker while the other was idle"
        finally:
            long.join(120)
        choices = _metric(router.url, "pdorch_router_decode_choices_total")
        assert choices.get('{reason="prefix_match"}', 0) >= 4, choices
    finally:
        router.stop()
        cluster.stop()
