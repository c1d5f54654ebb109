"""KVEventJournal (pdorch/worker/kv_events.py): seq, net batches, snapshots, resume, slow subscribers,
refusals, and the allocator's listener hook. Cuts are driven by hand (no publisher thread) but one test."""

from __future__ import annotations

import threading
import time

import pytest
from prometheus_client import CollectorRegistry

from engine.page_allocator import PageAllocator
from pdorch.worker.kv_events import KVEventJournal, hashes_of
from pdorch.worker.kv_subscription import StreamEnded
from pdorch.worker.status import WorkerLoad
from store_client.page_hash import HASH_SCHEME, KV_LAYOUT_VERSION

PAGE = 16


def journal(**kw) -> KVEventJournal:
    registry = CollectorRegistry()
    j = KVEventJournal("prefill-test", PAGE, lambda: WorkerLoad(1, 2, 30, 0), registry, **kw)
    j.test_registry = registry
    return j


def sub_of(j: KVEventJournal, epoch: str = "", after_seq: int = 0):
    s = j.subscribe(HASH_SCHEME, PAGE, KV_LAYOUT_VERSION, epoch, after_seq, "t")
    assert not isinstance(s, str), s
    return s


def drain(s) -> list:
    out = []
    while (b := s.get(0.0)) is not None:
        out.append(b)
    return out


def metric(j: KVEventJournal, name: str, **labels) -> float:
    return j.test_registry.get_sample_value(name, labels or None) or 0.0


def test_seq_is_consecutive_and_batches_are_net_changes():
    j = journal()
    s = sub_of(j)
    assert s.initial[0].snapshot and s.initial[0].seq == 0
    j.l1_stored(["a", "b"])
    j.store_written(["a"])
    b1 = j.cut(heartbeat=False)
    j.l1_removed(["a"])
    j.l1_stored(["c"])
    j.l1_removed(["c"])  # stored and removed between two cuts: in neither list
    j.l1_removed(["b"])
    j.l1_stored(["b"])  # removed and stored again: no change either
    b2 = j.cut(heartbeat=False)
    assert j.cut(heartbeat=False) is None  # nothing changed, no heartbeat asked
    b3 = j.cut(heartbeat=True)
    assert [b.seq for b in (b1, b2, b3)] == [1, 2, 3]
    assert (b1.l1_stored, b1.store_written, b1.l1_removed) == (("a", "b"), ("a",), ())
    assert (b2.l1_stored, b2.l1_removed) == ((), ("a",))
    assert b3.num_hashes == 0 and (b3.free_pages, b3.queued, b3.running) == (30, 1, 2)
    assert drain(s) == [b1, b2, b3]
    assert metric(j, "pdorch_kv_events_batches_total") == 3
    assert metric(j, "pdorch_kv_events_published_total", kind="l1_stored") == 2


def test_heartbeat_after_the_interval_only():
    now = [0.0]
    j = journal(heartbeat_s=1.0, clock=lambda: now[0])
    assert j.cut().seq == 1  # the first cut publishes the load numbers; they stay the same from here
    now[0] = 0.5
    assert j.cut() is None
    now[0] = 1.01
    hb = j.cut()
    assert hb is not None and hb.seq == 2 and hb.num_hashes == 0
    now[0] = 1.5
    assert j.cut() is None


def test_a_request_started_or_ended_is_published_at_the_next_cut_not_the_next_heartbeat():
    now, load = [0.0], [WorkerLoad(0, 1, 30, 0)]
    j = KVEventJournal("decode-test", PAGE, lambda: load[0], CollectorRegistry(), heartbeat_s=1.0,
                       clock=lambda: now[0])
    first = j.cut()
    assert first is not None and (first.queued, first.running) == (0, 1)
    now[0] = 0.05
    load[0] = WorkerLoad(0, 1, 12, 0)  # pages taken, the same requests: no batch before the heartbeat
    assert j.cut() is None
    now[0] = 0.1
    load[0] = WorkerLoad(0, 0, 12, 0)  # the request ended
    ended = j.cut()
    assert ended is not None and ended.num_hashes == 0 and (ended.running, ended.seq) == (0, 2)
    now[0] = 0.15
    load[0] = WorkerLoad(2, 0, 12, 0)  # two queued
    assert j.cut().queued == 2
    now[0] = 0.2
    assert j.cut() is None


def test_snapshot_holds_the_state_of_the_last_cut_after_stored_removed_cleared():
    j = journal()
    j.l1_stored(["a", "b", "c"])
    j.store_written(["a", "b"])
    j.cut()
    j.l1_removed(["b"])
    j.store_removed(["a"])
    j.cut()
    j.l1_stored(["d"])  # pending, not yet cut: belongs to seq 3, not the snapshot
    j.store_removed(["b"])
    snap = sub_of(j).initial
    assert len(snap) == 1 and snap[0].snapshot and snap[0].seq == 2
    assert set(snap[0].l1_stored) == {"a", "c"} and set(snap[0].store_written) == {"b"}
    j.cut()
    j.l1_cleared()
    j.cut()
    snap = sub_of(j).initial[0]
    assert snap.seq == 4 and snap.l1_stored == () and snap.store_written == ()
    assert metric(j, "pdorch_kv_events_snapshots_total") == 2


def test_cleared_publishes_every_l1_hash_removed():
    j = journal()
    j.l1_stored(["a", "b"])
    j.cut()
    j.l1_stored(["c"])
    j.l1_cleared()
    b = j.cut()
    assert set(b.l1_removed) == {"a", "b"} and b.l1_stored == ()


def test_resume_after_seq_gets_the_batches_after_it_without_a_snapshot():
    j = journal()
    batches = []
    for h in "abcde":
        j.l1_stored([h])
        batches.append(j.cut())
    s = sub_of(j, j.epoch, 2)
    assert s.initial == batches[2:]
    caught_up = sub_of(j, j.epoch, 5)
    assert caught_up.initial == []
    j.l1_stored(["f"])
    b6 = j.cut()
    assert drain(s) == [b6] and drain(caught_up) == [b6]
    assert metric(j, "pdorch_kv_events_resumes_total") == 2


@pytest.mark.parametrize("case", ["too_old", "other_epoch", "future_seq", "empty_epoch"])
def test_a_resume_the_journal_cannot_serve_gets_a_snapshot(case):
    j = journal(ring_batches=3)
    for h in "abcdef":
        j.l1_stored([h])
        j.cut()
    assert j.num_held()[0] == 3  # seqs 4..6
    epoch, after = {"too_old": (j.epoch, 2), "other_epoch": ("0" * 32, 5), "future_seq": (j.epoch, 9),
                    "empty_epoch": ("", 5)}[case]
    init = sub_of(j, epoch, after).initial
    assert len(init) == 1 and init[0].snapshot and init[0].seq == 6
    assert set(init[0].l1_stored) == set("abcdef")
    # the oldest held batch's predecessor is still a valid resume point
    assert [b.seq for b in sub_of(j, j.epoch, 3).initial] == [4, 5, 6]


def test_ring_is_bounded_by_hashes_too():
    j = journal(ring_hashes=10)
    for i in range(5):
        j.l1_stored([f"{i}-{k}" for k in range(4)])
        j.cut()
    batches, hashes = j.num_held()
    assert (batches, hashes) == (2, 8)


def test_store_mirror_is_bounded_and_what_leaves_it_is_published_removed():
    j = journal(store_max_pages=3)
    j.store_written(["a", "b", "c"])
    j.cut()
    j.store_written(["d", "a"])  # a rewritten: newest again; b is the oldest and leaves
    b = j.cut()
    assert b.store_written == ("d",) and b.store_removed == ("b",)
    assert set(sub_of(j).initial[0].store_written) == {"c", "d", "a"}
    assert j.num_pages() == (0, 3)


def test_slow_subscriber_is_dropped_and_producers_never_wait():
    j = journal(queue_batches=4)
    slow, fast = sub_of(j), sub_of(j)
    ended = threading.Event()
    slow.on_end(ended.set)
    got = []
    for i in range(10):
        j.l1_stored([str(i)])
        j.cut()
        got += drain(fast)
    assert ended.is_set() and slow.ended == "slow"
    with pytest.raises(StreamEnded):
        slow.get(0.0)
    assert [b.seq for b in got] == list(range(1, 11))
    assert j.num_subscribers() == 1
    assert metric(j, "pdorch_kv_events_subscribers_dropped_total", reason="slow") == 1
    # producers: a burst of changes with a subscriber that never reads costs no waiting
    stalled = sub_of(j)
    t0 = time.perf_counter()
    for i in range(20000):
        j.l1_stored([f"x{i}"])
        if i % 100 == 0:
            j.cut()
    assert time.perf_counter() - t0 < 5.0
    assert stalled.ended == "slow"
    resumed = sub_of(j, j.epoch, 10)  # the dropped one resumes where it was, while the ring holds it
    assert resumed.initial[0].seq == 11 and not resumed.initial[0].snapshot


def test_pending_overflow_drops_every_subscriber_and_refuses_resumes_from_before():
    j = journal(max_pending=5)
    s = sub_of(j)
    j.l1_stored(["a"])
    j.cut()
    j.l1_stored([str(i) for i in range(10)])  # more than max_pending between two cuts
    b = j.cut(heartbeat=True)
    assert s.ended == "overflow" and b.seq == 2 and b.num_hashes == 0
    init = sub_of(j, j.epoch, 1).initial  # batches 1 -> 2 lost the changes: a snapshot
    assert init[0].snapshot and set(init[0].l1_stored) == {"a", *map(str, range(10))}
    assert not sub_of(j, j.epoch, 2).initial  # from after the overflow a resume is fine
    assert metric(j, "pdorch_kv_events_subscribers_dropped_total", reason="overflow") == 1


@pytest.mark.parametrize("field,args,words", [
    ("hash_scheme", ("xxhash", PAGE, KV_LAYOUT_VERSION), ["hash_scheme", "'xxhash'", "'sha256-chain'"]),
    ("page_size", (HASH_SCHEME, 32, KV_LAYOUT_VERSION), ["page_size", "32", "16"]),
    ("layout_version", (HASH_SCHEME, PAGE, KV_LAYOUT_VERSION + 1),
     ["layout_version", str(KV_LAYOUT_VERSION + 1), str(KV_LAYOUT_VERSION)]),
])
def test_refusal_names_the_field_and_both_values(field, args, words):
    j = journal()
    text = j.subscribe(*args)
    assert isinstance(text, str)
    assert all(w in text for w in words), text
    assert metric(j, "pdorch_kv_events_refused_total", field=field) == 1
    assert j.num_subscribers() == 0


def test_subscriptions_beyond_the_bound_end_at_once():
    j = journal(max_subscribers=2)
    a, b = sub_of(j), sub_of(j)
    assert sub_of(j).ended == "full"
    j.unsubscribe(a)
    assert sub_of(j).ended is None and b.ended is None


def test_end_streams_ends_every_subscription_and_refuses_new_ones():
    j = journal()
    s = sub_of(j)
    j.end_streams()
    assert s.ended == "stopped"
    assert sub_of(j).ended == "stopped"


def test_publisher_thread_cuts_and_heartbeats_and_stops_within_its_deadline():
    j = journal(cut_interval_s=0.01, heartbeat_s=0.1).start()
    try:
        s = sub_of(j)
        j.l1_stored(["a"])
        b = s.get(2.0)
        assert b is not None and b.l1_stored == ("a",) and b.seq == 1
        hb = s.get(2.0)
        assert hb is not None and hb.seq == 2 and hb.num_hashes == 0
    finally:
        t0 = time.monotonic()
        j.stop(timeout_s=2.0)
    assert time.monotonic() - t0 < 2.0 and not j._thread.is_alive()
    with pytest.raises(StreamEnded, match="stopped"):
        s.get(0.0)


def test_allocator_listener_sees_new_hashes_evictions_and_flush():
    alloc = PageAllocator(4)
    j = journal()
    alloc.listener = j
    pages = alloc.allocate(3)
    for i, p in enumerate(pages):
        alloc.cache(f"h{i}", p)
    alloc.cache("h0", pages[0])  # a hash already cached: nothing new
    alloc.release(pages)
    b = j.cut()
    assert b.l1_stored == ("h0", "h1", "h2")
    alloc.allocate(3)  # one free page, then two cached ones evicted (tail first: h2, h1)
    b = j.cut()
    assert set(b.l1_removed) == {"h2", "h1"} and b.l1_stored == ()
    alloc.flush()
    assert j.cut().l1_removed == ("h0",)
    alloc.check_integrity()


def test_hashes_of_strips_the_fingerprint():
    assert hashes_of(["fp-1/abc", "def"]) == ["abc", "def"]


def test_worker_journal_is_fed_by_the_allocator_the_store_writes_the_evictor_and_leader_switch_losses():
    from types import SimpleNamespace

    from pdorch.worker.kv_events import worker_journal

    evicted = []
    rt = SimpleNamespace(page_size=PAGE, allocator=PageAllocator(2), store_io=SimpleNamespace(on_saved=None),
                         evictor=SimpleNamespace(on_removed=None), store=SimpleNamespace(on_lost=None))
    lost = []
    j = worker_journal(rt, 100, "w", lambda: WorkerLoad(0, 0, 0, 0), CollectorRegistry(), evicted.append, lost.append)
    j.stop()  # the publisher stopped: cuts by hand
    rt.allocator.cache("h1", rt.allocator.allocate(1)[0])
    rt.store_io.on_saved(["fp/h1", "fp/h2"])
    b = j.cut()
    assert (b.l1_stored, b.store_written) == (("h1",), ("h1", "h2"))
    rt.evictor.on_removed(["fp/h2"])
    assert evicted == [["fp/h2"]]  # the scheduler still hears of it
    assert j.cut().store_removed == ("h2",)
    rt.store.on_lost(["fp/h1"])  # a master leader switch lost it: the scheduler writes it again
    assert lost == [["fp/h1"]] and evicted == [["fp/h2"]]
    assert j.cut().store_removed == ("h1",)


def test_claims_of_pages_in_flight_travel_in_batches_and_snapshots():
    """A prefill request's claims (prefill_node/inflight.py): claimed and released as net changes, the
    open ones in a snapshot, each kind counted."""
    j = journal()
    j.inflight_claimed(["p1", "p2", "p3"])
    b1 = j.cut(heartbeat=False)
    j.inflight_released(["p1", "p2"])
    j.l1_stored(["p1", "p2"])  # computed: in L1 now
    b2 = j.cut(heartbeat=False)
    assert (b1.inflight_claimed, b1.inflight_released) == (("p1", "p2", "p3"), ())
    assert (b2.inflight_claimed, b2.inflight_released, b2.l1_stored) == ((), ("p1", "p2"), ("p1", "p2"))
    snap = sub_of(j).initial[0]
    assert snap.snapshot and snap.inflight_claimed == ("p3",)
    assert metric(j, "pdorch_kv_events_published_total", kind="inflight_claimed") == 3
    assert metric(j, "pdorch_kv_events_published_total", kind="inflight_released") == 2
