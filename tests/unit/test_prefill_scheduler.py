"""The prefill scheduler with small fakes for the model, transfer and store (pure scheduling logic):
exact pages, reuse per tier, chunking, and that pages come back only once no I/O touches them."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from engine.sampling_params import SamplingParams
from pdorch.config_loader import load_config
from pdorch.worker.errors import Aborted, PeerFailed
from pdorch.worker.metrics import WorkerRecorder
from pdorch.worker.prefill_rpc import PrefillJob
from prefill_node.messages import Abort, Submit
from prefill_node.pusher import KVPusher
from prefill_node.scheduler import PrefillScheduler
from prefill_node.task import Phase, PhaseError, PrefillTask
from store_client.io_thread import IOCompletion
from store_client.page_hash import page_hashes, store_key
from tests.fixtures.runtime import stand_in_runtime

PAGE_SIZE = 4
FIRST_TOKEN = 3


class FakeRunner:
    def __init__(self):
        self.chunks = []

    def forward(self, chunks):
        self.chunks.extend(chunks)
        logits = torch.zeros(len(chunks), 8)
        logits[:, FIRST_TOKEN] = 1.0
        return logits


class FakeTransfer:
    def __init__(self, fail=False):
        self.writes, self.fail = [], fail

    def write(self, segment, local, remote, page_nbytes, peer_ranks=()):
        if self.fail:
            raise RuntimeError("peer dead")
        self.writes.append((segment, list(local), list(remote)))
        return len(local) * page_nbytes


class FakeStoreIO:
    """Keys in `present` load; completions are held while `hold` is set."""

    def __init__(self, present=()):
        self.present, self.saved, self.done, self.loads = set(present), [], [], []
        self.load_addrs = []  # per load, the pool addresses it writes
        self.hold = threading.Event()  # hold every completion
        self.hold_saves = threading.Event()  # hold save completions only
        self.held = []
        self.on_complete = None  # set by the scheduler loop: completions wake it, like StoreIO's

    def _deliver(self, done, held):
        if held:
            self.held.append(done)
            return
        self.done.append(done)
        if self.on_complete is not None:
            self.on_complete()

    def submit_load(self, tag, keys, addrs):
        self.loads.append(list(keys))
        self.load_addrs.append(list(addrs))
        ok = tuple(k in self.present for k in keys)
        reason = "ok" if all(ok) else "absent"
        self._deliver(IOCompletion(tag, "load", sum(ok), reason, len(keys), page_ok=ok), self.hold.is_set())

    def submit_save(self, tag, keys, addrs):
        self.saved.extend(keys)
        self.present.update(keys)
        held = self.hold.is_set() or self.hold_saves.is_set()
        self._deliver(IOCompletion(tag, "save", len(keys), "ok", len(keys), page_ok=(True,) * len(keys)), held)
        return True

    def release(self):
        self.hold.clear()
        self.hold_saves.clear()
        self.done.extend(self.held)
        self.held = []
        if self.on_complete is not None:
            self.on_complete()

    def poll(self):
        out, self.done = self.done, []
        return out

    def cancel_saves(self, tags=None, min_age_s=0.0):
        return 0

    def _cancel_held(self):
        """Complete held saves as cancelled (what StoreIO.cancel_saves does to queued ones)."""
        n = 0
        for i, d in enumerate(self.held):
            if d.op == "save":
                self.held[i] = IOCompletion(d.tag, "save", 0, "cancelled", d.num_pages,
                                            page_ok=(False,) * d.num_pages)
                n += d.num_pages
        self.done.extend(self.held)
        self.held = []
        if self.on_complete is not None:
            self.on_complete()
        return n


def prefill_cfg(**keys):
    """The `prefill` config section with these keys set (the L1 prefix cache on, as by default)."""
    return replace(load_config(None).prefill, **keys)


def make(num_pages=8, chunk_tokens=64, store_io=None, transfer=None, start=True, **prefill):
    rt = stand_in_runtime(FakeRunner(), num_pages, PAGE_SIZE, store_io=store_io)
    transfer = transfer or FakeTransfer()
    sched = PrefillScheduler(rt, prefill_cfg(chunk_tokens=chunk_tokens, **prefill), rt.cfg.store,
                             pusher=KVPusher(transfer, 100), recorder=WorkerRecorder("prefill"))
    if start:
        sched.start()
    return sched, rt, transfer


def submit(sched, tokens, rid="r", dest=None, trace_ctx=None):
    n_pages = -(-len(tokens) // PAGE_SIZE)
    job = PrefillJob(rid, tuple(tokens), SamplingParams(temperature=0.0), "10.0.0.1:9",
                     dest or tuple(range(50_000, 50_000 + n_pages * 100, 100)), 10.0, PAGE_SIZE, "fp")
    task = PrefillTask(job=job, deadline=time.monotonic() + 10, trace_ctx=trace_ctx)
    sched.post(Submit(task))
    return task


def abort(sched, rid):
    """The Abort RPC's message (PrefillWorker.abort posts it)."""
    sched.post(Abort(rid))


def settle(sched, rt, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while sched.call(lambda: len(sched._tasks)) and time.monotonic() < deadline:
        time.sleep(0.01)
    rt.allocator.check_integrity()


def test_l1_reuse_computes_only_the_tail_and_pushes_every_page():
    sched, rt, transfer = make(chunk_tokens=4)
    try:
        tokens = list(range(10, 20))  # 10 tokens: pages [0 full][1 full][2: 2 tokens]
        first = submit(sched, tokens, "a").future.result(5)
        assert (first.first_token_id, first.cached.device, first.prompt_tokens) == (FIRST_TOKEN, 0, 10)
        assert [(c.start_pos, len(c.token_ids)) for c in rt.runner.chunks] == [(0, 4), (4, 4), (8, 2)]
        settle(sched, rt)
        # full pages 0 and 1 stay cached (evictable), the partial page 2 is free again
        assert rt.allocator.num_cached() == 2 and rt.allocator.eviction_order()[-2:] == [1, 0]
        rt.runner.chunks.clear()
        second = submit(sched, tokens, "b").future.result(5)
        assert second.cached.device == 8
        # the tail gets page 2 again: the lowest free page (free pages go out in page order)
        assert [(c.start_pos, list(c.page_ids)) for c in rt.runner.chunks] == [(8, [0, 1, 2])]
        assert transfer.writes[-1][1] == [1000, 1100, 1200]  # all three prompt pages pushed
        settle(sched, rt)
        assert rt.allocator.num_available() == 8
    finally:
        sched.stop()


def test_store_pages_load_into_the_pool_and_new_pages_are_written_back():
    tokens = list(range(30, 43))  # 13 tokens: 3 full pages, reusable 3
    keys = [store_key("fp", h) for h in page_hashes(tokens, PAGE_SIZE)]
    io = FakeStoreIO(present=keys[:2])
    sched, rt, _ = make(store_io=io)
    try:
        res = submit(sched, tokens).future.result(5)
        assert (res.cached.device, res.cached.store) == (0, 8)
        assert rt.runner.chunks[0].start_pos == 8
        settle(sched, rt)
        assert io.saved == [keys[2]]  # only the page computed here goes back to the store
    finally:
        sched.stop()


def test_abort_during_store_load_answers_at_once_but_frees_pages_after_the_load():
    tokens = list(range(50, 62))
    io = FakeStoreIO(present=[store_key("fp", h) for h in page_hashes(tokens, PAGE_SIZE)])
    io.hold.set()
    sched, rt, _ = make(store_io=io)
    try:
        task = submit(sched, tokens, "x")
        deadline = time.monotonic() + 10
        while not io.loads:  # admitted, its store load in flight (no fixed sleep: machines are slow)
            assert time.monotonic() < deadline, "the task never started its store load"
            time.sleep(0.005)
        abort(sched, "x")
        with pytest.raises(Aborted):
            task.future.result(5)
        assert sched.call(lambda: rt.allocator.num_available()) == 8 - 3  # the load still writes them
        io.release()
        settle(sched, rt)
        assert rt.allocator.num_available() == 8
    finally:
        sched.stop()


def test_failed_push_fails_the_request_and_frees_its_pages():
    sched, rt, _ = make(transfer=FakeTransfer(fail=True))
    try:
        with pytest.raises(PeerFailed, match="peer dead"):
            submit(sched, list(range(9))).future.result(5)
        settle(sched, rt)
        assert rt.allocator.num_available() == 8
    finally:
        sched.stop()


def test_concurrent_requests_share_the_token_budget():
    sched, rt, _ = make(num_pages=16, chunk_tokens=6, start=False)
    try:
        tasks = [submit(sched, list(range(100 * i, 100 * i + 10)), f"c{i}") for i in range(2)]
        sched.start()  # both queued before the first step: FIFO over one 6-token budget per step
        concurrent.futures.wait([t.future for t in tasks], timeout=5)
        steps = [(c.token_ids[0] // 100, c.start_pos, len(c.token_ids)) for c in rt.runner.chunks]
        assert steps == [(0, 0, 6), (0, 6, 4), (1, 0, 2), (1, 2, 6), (1, 8, 2)]
        settle(sched, rt)
    finally:
        sched.stop()


def test_a_retried_request_id_is_served_while_the_old_task_still_writes_back():
    io = FakeStoreIO()
    io.hold_saves.set()  # the first request's write-back stays in flight
    sched, rt, _ = make(store_io=io)
    try:
        tokens = list(range(200, 209))
        assert submit(sched, tokens, "same").future.result(5).cached.device == 0
        again = submit(sched, tokens, "same").future.result(5)
        assert again.cached.device == 8  # L1 pages of the first attempt, still pinned by its save
        assert sched.call(lambda: rt.allocator.num_available()) < 8
        io.release()
        settle(sched, rt)
        assert rt.allocator.num_available() == 8
    finally:
        sched.stop()


def test_a_missing_store_page_costs_only_itself():
    tokens = list(range(300, 318))  # 18 tokens: 4 full pages, all reusable, tail = page 4 (2 tokens)
    keys = [store_key("fp", h) for h in page_hashes(tokens, PAGE_SIZE)]
    io = FakeStoreIO(present=[keys[0], keys[1], keys[3]])  # page 2 is a hole
    sched, rt, _ = make(store_io=io)
    try:
        res = submit(sched, tokens).future.result(5)
        assert io.loads == [keys]  # one load of every page L1 lacks, past the gap
        assert (res.cached.device, res.cached.store) == (0, 12)
        # the hole and the tail are computed, in one forward; page 3 is not recomputed
        assert [(c.start_pos, c.end) for c in rt.runner.chunks] == [(8, 12), (16, 18)]
        settle(sched, rt)
        assert io.saved == [keys[2]]  # the recomputed hole goes back to the store
        assert sched._persist.metrics.holes._value.get() == 1
    finally:
        sched.stop()


def test_an_l1_hit_the_store_lacks_is_backfilled():
    tokens = list(range(400, 413))  # 3 full pages, 3 reusable
    keys = [store_key("fp", h) for h in page_hashes(tokens, PAGE_SIZE)]
    sched, rt, _ = make(store_io=None)  # first turn without a store: L1 pages are unpersisted
    try:
        submit(sched, tokens, "a").future.result(5)
        settle(sched, rt)
        assert sched.call(lambda: rt.allocator.num_unpersisted()) == 3
    finally:
        sched.stop()
    io = FakeStoreIO()
    rt.store_io, rt.store = io, SimpleNamespace(enabled=True)
    sched2 = PrefillScheduler(rt, prefill_cfg(chunk_tokens=64), rt.cfg.store, pusher=KVPusher(FakeTransfer(), 100),
                              recorder=WorkerRecorder("prefill"))
    sched2.start()
    try:
        res = submit(sched2, tokens, "b").future.result(5)
        assert res.cached.device == 12
        settle(sched2, rt)
        assert sorted(io.saved) == sorted(keys)  # all three L1 hits written back to the store
        assert sched2.call(lambda: rt.allocator.num_unpersisted()) == 0
    finally:
        sched2.stop()


def test_under_pressure_a_request_waits_for_writes_instead_of_dropping_pages():
    io = FakeStoreIO()
    io.hold_saves.set()  # write-backs stay in flight until released
    sched, rt, _ = make(num_pages=6, store_io=io, persist_wait_s=30.0)
    try:
        submit(sched, list(range(500, 513)), "a").future.result(5)  # 4 pages, 3 full: saved (held)
        late = submit(sched, list(range(600, 613)), "b")  # needs 4 pages: only 2 free, 3 pinned by a's save
        metrics = sched._persist.metrics
        deadline = time.monotonic() + 5
        # the scheduler saw b and chose to wait for a's writes (before admitting it: a holds pages)
        while metrics.pressure_waits._value.get() + metrics.paced._value.get() == 0:
            assert time.monotonic() < deadline, "b was never held back for a's writes"
            time.sleep(0.01)
        assert not late.future.done()
        io.release()  # a's pages reach the store: now they may be reclaimed without loss
        assert late.future.result(5).cached.device == 0
        settle(sched, rt)
        assert not rt.allocator.evicted_unpersisted  # nothing left L1 unpersisted
        assert sched._persist.metrics.cancelled._value.get() == 0
    finally:
        sched.stop()


def test_past_the_wait_bound_pages_are_dropped_with_a_counted_reason():
    io = FakeStoreIO()
    io.hold_saves.set()
    sched, rt, _ = make(num_pages=6, store_io=io, persist_wait_s=0.05)
    try:
        submit(sched, list(range(700, 713)), "a").future.result(5)
        io.cancel_saves = lambda tags=None, min_age_s=0.0: io._cancel_held()
        late = submit(sched, list(range(800, 813)), "b")
        assert late.future.result(5).cached.device == 0
        settle(sched, rt)
        assert rt.allocator.evicted_unpersisted["cancelled"] >= 1
        assert sched._persist.metrics.cancelled._value.get() >= 1
    finally:
        sched.stop()


def test_pages_the_store_evictor_removed_stay_in_l1_and_are_not_written_again():
    tokens = list(range(900, 913))  # 3 full pages
    keys = [store_key("fp", h) for h in page_hashes(tokens, PAGE_SIZE)]
    io = FakeStoreIO()
    sched, rt, _ = make(store_io=io)
    try:
        submit(sched, tokens, "a").future.result(5)
        settle(sched, rt)
        assert sched.call(lambda: rt.allocator.num_unpersisted()) == 0
        sched.store_evicted([keys[2]])
        assert sched.call(lambda: rt.allocator.num_unpersisted()) == 1
        io.saved.clear()
        assert submit(sched, tokens, "b").future.result(5).cached.device == 12
        settle(sched, rt)
        assert io.saved == []  # an L1 hit the store dropped on purpose is not backfilled
    finally:
        sched.stop()


def test_the_page_hashes_d_sent_are_used_not_recomputed():
    tokens = list(range(30, 43))  # 13 tokens: 3 full pages, all reusable
    sent = ("aa" * 32, "bb" * 32, "cc" * 32)  # not the tokens' own hashes: only D's can name these keys
    io = FakeStoreIO()
    sched, rt, _ = make(store_io=io)
    try:
        job = PrefillJob("h", tuple(tokens), SamplingParams(temperature=0.0), "10.0.0.1:9",
                         tuple(range(50_000, 50_400, 100)), 10.0, PAGE_SIZE, "fp", page_hashes=sent)
        task = PrefillTask(job=job, deadline=time.monotonic() + 10)
        sched.post(Submit(task))
        task.future.result(5)
        assert io.loads == [[store_key("fp", h) for h in sent]]
        settle(sched, rt)
    finally:
        sched.stop()


def test_a_queued_prompt_waits_for_the_one_before_it_rather_than_evict_what_the_store_dropped():
    io = FakeStoreIO()
    sched, rt, _ = make(num_pages=9, store_io=io, persist_wait_s=30.0)
    try:
        kept = list(range(100, 109))  # 9 tokens: 2 full pages cached, then dropped by the store
        submit(sched, kept, "x").future.result(5)
        settle(sched, rt)
        sched.store_evicted([store_key("fp", h) for h in page_hashes(kept, PAGE_SIZE)])  # L1 is now their only home
        io.hold_saves.set()  # a's write-back stays in flight
        a = submit(sched, list(range(200, 213)), "a")  # 4 pages of the 7 free
        b = submit(sched, list(range(300, 313)), "b")  # 4 more: 3 free + 1 of x's
        a.future.result(5)
        paced = sched._persist.metrics.paced
        deadline = time.monotonic() + 5
        while paced._value.get() == 0:  # b waits for a's pages instead of taking one of x's
            assert time.monotonic() < deadline, "b was admitted while a still held its pages"
            time.sleep(0.01)
        assert not b.future.done()
        io.release()  # a's pages are in the store now: b takes them
        b.future.result(5)
        settle(sched, rt)
        assert len(sched.call(lambda: rt.allocator.pages_of(page_hashes(kept, PAGE_SIZE)[:2]))) == 2  # x kept both
        assert not rt.allocator.evicted_unpersisted
    finally:
        sched.stop()


def test_pages_a_leader_switch_lost_are_written_again_in_chunks_that_never_outrun_the_io_queue():
    tokens = list(range(2000, 2000 + 40 * PAGE_SIZE))  # 40 full pages
    keys = [store_key("fp", h) for h in page_hashes(tokens, PAGE_SIZE)]
    io = FakeStoreIO()
    sched, rt, _ = make(num_pages=48, chunk_tokens=1024, store_io=io)
    sched._persist._restore.chunk_pages, sched._persist._restore.max_in_flight = 8, 2
    try:
        submit(sched, tokens, "a").future.result(5)
        settle(sched, rt)
        io.saved.clear()
        io.hold_saves.set()
        sched.store_lost(keys + [store_key("fp", "not-held")])
        deadline = time.monotonic() + 5
        while len(io.saved) < 16 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)
        assert io.saved == keys[:16]  # two chunks of 8 queued, the rest waits for them
        assert sched.call(lambda: rt.allocator.num_unpersisted()) == 40
        deadline = time.monotonic() + 5
        while len(io.saved) < 40 and time.monotonic() < deadline:
            io.release()  # each landed chunk lets the next one go
            io.hold_saves.set()
            time.sleep(0.02)
        io.release()
        settle(sched, rt)
        assert sorted(io.saved) == sorted(keys)  # every held page once
        deadline = time.monotonic() + 5
        while sched.call(lambda: rt.allocator.num_unpersisted()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sched.call(lambda: rt.allocator.num_unpersisted()) == 0
    finally:
        sched.stop()


def test_a_task_moves_only_along_its_lifecycle():
    """PrefillTask.advance is the one writer of the phase besides fail: a move the lifecycle does not
    have (a skipped phase, a failed task going on) raises instead of passing silently."""
    job = PrefillJob("p", (1, 2, 3), SamplingParams(), "seg", (0,), 10.0, PAGE_SIZE, "fp")
    task = PrefillTask(job=job, deadline=time.monotonic() + 10)
    with pytest.raises(PhaseError):
        task.advance(Phase.PUSHING)  # WAITING -> PUSHING would skip admission and compute
    task.advance(Phase.COMPUTING)
    task.advance(Phase.PUSHING)
    task.fail(Aborted("gone"))
    with pytest.raises(PhaseError):
        task.advance(Phase.DONE)  # a failed task stays failed
    assert task.phase is Phase.FAILED
