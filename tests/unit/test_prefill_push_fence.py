"""The prefill worker never answers a failed request while its KV push into D's pages still runs, and
never leaks pages when the push cannot even start (small fakes for model, transfer and pool)."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from engine.sampling_params import SamplingParams
from pdorch.config_loader import load_config
from pdorch.worker.errors import Aborted, DeadlineExceeded
from pdorch.worker.metrics import WorkerRecorder
from pdorch.worker.prefill_rpc import PrefillJob
from prefill_node import worker as prefill_worker
from prefill_node.worker import PrefillWorker
from tests.fixtures.runtime import stand_in_runtime
from tests.fixtures.threads import in_thread
from tests.unit.test_prefill_scheduler import FakeRunner, make, settle, submit

PAGE_SIZE = 4


class GatedTransfer:
    """A push that runs until the test lets it return (a slow or stuck batch_transfer_sync_write)."""

    def __init__(self):
        self.started = threading.Event()
        self.go = threading.Event()
        self.returned_at: float | None = None
        self.writes = 0

    def write(self, segment, local, remote, page_nbytes, peer_ranks=()):
        self.writes += 1
        self.started.set()
        assert self.go.wait(30), "the test never let the push return"
        self.returned_at = time.monotonic()
        return len(local) * page_nbytes


@pytest.fixture
def worker_and_transfer():
    transfer = GatedTransfer()
    cfg = load_config(None)
    cfg = replace(cfg, model=replace(cfg.model, page_size=PAGE_SIZE, max_context_tokens=256),
                  store=replace(cfg.store, write_back=False))
    rt = stand_in_runtime(FakeRunner(), 16, PAGE_SIZE, cfg=cfg, transfer=transfer)
    w = PrefillWorker(rt, cfg.prefill, cfg.store, "p-test", WorkerRecorder("prefill"))
    yield w, transfer, rt
    transfer.go.set()
    w.close()


def job(rid: str, timeout_s: float, n: int = 10) -> PrefillJob:
    return PrefillJob(rid, tuple(i % 7 + 1 for i in range(n)), SamplingParams(temperature=0.0), "10.0.0.1:9",
                      tuple(50_000 + 100 * i for i in range(-(-n // PAGE_SIZE))), timeout_s, PAGE_SIZE, "fp")


def answer_in_thread(w, j):
    """The RPC handler's part on a thread: box["task"] once started, then "result" or "error" and "at"."""
    box: dict = {}

    def answer():
        box["task"] = w.start(j)
        return w.wait(box["task"])

    return in_thread(answer, box=box)


def test_a_request_failing_mid_push_is_answered_only_after_the_push_returned(worker_and_transfer):
    w, transfer, rt = worker_and_transfer
    t, box = answer_in_thread(w, job("late", timeout_s=0.5))
    assert transfer.started.wait(10)
    # The deadline passes while the push runs: the scheduler fails the task, but its answer must wait.
    deadline = time.monotonic() + 10
    while not box["task"].future.done():
        assert time.monotonic() < deadline, "the task was never failed at its deadline"
        time.sleep(0.02)
    time.sleep(0.3)  # the handler had every chance to answer early
    assert "at" not in box, "answered while the KV push into D's pages still ran"
    transfer.go.set()
    t.join(10)
    assert isinstance(box["error"], DeadlineExceeded)
    assert box["at"] >= transfer.returned_at
    assert box["task"].push.writes_over
    settle(w._scheduler, rt)
    assert rt.allocator.num_available() == rt.allocator.num_total


def test_abort_rpc_confirms_only_once_the_push_stopped(worker_and_transfer, monkeypatch):
    w, transfer, rt = worker_and_transfer
    monkeypatch.setattr(prefill_worker, "ABORT_STOP_WAIT_S", 0.2)
    t, box = answer_in_thread(w, job("abort-me", timeout_s=30))
    assert transfer.started.wait(10)
    with pytest.raises(DeadlineExceeded, match="still running"):
        w.abort("abort-me")  # D asks: the push still runs, so no confirmation
    transfer.go.set()
    assert w.abort("abort-me") is False  # the push returned: confirmed (the task is already answered)
    t.join(10)
    assert isinstance(box["error"], Aborted)
    assert box["task"].push.writes_over and transfer.writes == 1
    settle(w._scheduler, rt)


def test_a_cancelled_task_never_starts_its_push(worker_and_transfer):
    w, transfer, rt = worker_and_transfer
    hold = threading.Event()
    held = threading.Thread(target=w._scheduler.call, args=(lambda: hold.wait(10),), daemon=True)
    held.start()  # the scheduler thread is busy: the task cannot get anywhere yet
    task = w.start(job("gone", timeout_s=30))
    w.cancel(task)  # the RPC ended (D went away) before the push
    hold.set()
    with pytest.raises(Aborted):
        w.wait(task)
    settle(w._scheduler, rt)
    assert transfer.writes == 0 and task.push.writes_over
    assert rt.allocator.num_available() == rt.allocator.num_total


class BrokenPusher:
    """A pusher that cannot start a push (e.g. shut down)."""

    def push(self, task, local_addrs, on_done):
        raise RuntimeError("cannot schedule new futures after shutdown")


def test_a_push_that_cannot_start_does_not_leak_the_pages():
    sched, rt, _ = make(num_pages=8, start=False)
    sched._push._pusher = BrokenPusher()  # the push phase's pusher (prefill_node/push_phase.py)
    sched.start()
    try:
        task = submit(sched, [i % 7 + 1 for i in range(9)], rid="broken")
        with pytest.raises(Exception, match="scheduler error"):
            task.future.result(timeout=10)
        settle(sched, rt)
        assert rt.allocator.num_available() == 8
    finally:
        sched.stop()
