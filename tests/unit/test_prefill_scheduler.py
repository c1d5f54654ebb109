"""The prefill scheduler with small fakes for the model, transfer and store (pure scheduling logic):
exact pages, reuse per tier, chunking, and that pages come back only once no I/O touches them."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from engine.page_allocator import PageAllocator
from engine.sampler import Sampler
from engine.sampling_params import SamplingParams
from pdorch.worker_errors import Aborted, PeerFailed
from pdorch.worker_metrics import WorkerRecorder
from prefill_node.job import PrefillJob
from prefill_node.pusher import KVPusher
from prefill_node.scheduler import PrefillScheduler
from prefill_node.task import PrefillTask
from store_client.io_thread import IOCompletion
from store_client.page_hash import page_hashes, store_key

P = 4
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

    def write(self, segment, local, remote, page_nbytes):
        if self.fail:
            raise RuntimeError("peer dead")
        self.writes.append((segment, list(local), list(remote)))
        return len(local) * page_nbytes


class FakeStoreIO:
    """Keys in `present` load; completions are held while `hold` is set."""

    def __init__(self, present=()):
        self.present, self.saved, self.done = set(present), [], []
        self.hold = threading.Event()  # hold every completion
        self.hold_saves = threading.Event()  # hold save completions only
        self.held = []

    def submit_load(self, tag, keys, addrs):
        n = 0
        while n < len(keys) and keys[n] in self.present:
            n += 1
        (self.held if self.hold.is_set() else self.done).append(IOCompletion(tag, "load", n, "ok"))

    def submit_save(self, tag, keys, addrs):
        self.saved.extend(keys)
        held = self.hold.is_set() or self.hold_saves.is_set()
        (self.held if held else self.done).append(IOCompletion(tag, "save", len(keys), "ok"))
        return True

    def release(self):
        self.hold.clear()
        self.hold_saves.clear()
        self.done.extend(self.held)
        self.held = []

    def poll(self):
        out, self.done = self.done, []
        return out

    def cancel_saves(self, tags=None):
        return 0


def make(num_pages=8, chunk_tokens=64, store_io=None, transfer=None, start=True):
    rt = SimpleNamespace(allocator=PageAllocator(num_pages), runner=FakeRunner(), sampler=Sampler(),
                         pool=SimpleNamespace(page_addrs=lambda ids: [1000 + 100 * i for i in ids], page_nbytes=100),
                         fingerprint="fp", store_io=store_io, store=SimpleNamespace(enabled=store_io is not None))
    transfer = transfer or FakeTransfer()
    sched = PrefillScheduler(rt, chunk_tokens, prefix_cache=True, write_back=True,
                             pusher=KVPusher(transfer, 100), recorder=WorkerRecorder("prefill"))
    if start:
        sched.start()
    return sched, rt, transfer


def submit(sched, tokens, rid="r", dest=None):
    n_pages = -(-len(tokens) // P)
    job = PrefillJob(rid, tuple(tokens), SamplingParams(temperature=0.0), "10.0.0.1:9",
                     dest or tuple(range(50_000, 50_000 + n_pages * 100, 100)), 10.0, P, "fp")
    task = PrefillTask(job=job, deadline=time.monotonic() + 10)
    sched.submit(task)
    return task


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
        assert [(c.start_pos, list(c.page_ids)) for c in rt.runner.chunks] == [(8, [0, 1, 3])]
        assert transfer.writes[-1][1] == [1000, 1100, 1300]  # all three prompt pages pushed
        settle(sched, rt)
        assert rt.allocator.num_available() == 8
    finally:
        sched.stop()


def test_store_pages_load_into_the_pool_and_new_pages_are_written_back():
    tokens = list(range(30, 43))  # 13 tokens: 3 full pages, reusable 3
    keys = [store_key("fp", h) for h in page_hashes(tokens, P)]
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
    io = FakeStoreIO(present=[store_key("fp", h) for h in page_hashes(tokens, P)])
    io.hold.set()
    sched, rt, _ = make(store_io=io)
    try:
        task = submit(sched, tokens, "x")
        time.sleep(0.1)
        sched.abort("x")
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
