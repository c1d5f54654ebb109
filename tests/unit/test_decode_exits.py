"""Every exit of a Generate request before the scheduler owns it gives its KV pages back.

A real DecodeWorker (tiny model, real pool and transfer engine, no store) in this process; an
unexpected exception is injected at each stage between admission and the scheduler taking the
request over, and the pool must be whole again (free pages, check_integrity()). The prefill answer
is a small fake where a stage needs one; the prefill address is a closed port, so pages the worker
fences are released as "peer_gone" (nothing listens: no write can land).
"""

from __future__ import annotations

import threading
import time

import pytest

from decode_node import first_token
from decode_node import worker as decode_worker
from decode_node.request import GenerateJob
from decode_node.worker import DecodeWorker
from engine.sampling_params import SamplingParams
from pdorch.local_stack.workers import make_config
from pdorch.ports import free_port
from pdorch.worker.errors import Aborted, WorkerError
from pdorch.worker.metrics import WorkerRecorder
from pdorch.worker.prefill_rpc import PrefillResult
from pdorch.worker.runtime import build_runtime


@pytest.fixture(scope="module")
def worker(tmp_path_factory, tiny_model_dir):
    cfg = make_config(tmp_path_factory.mktemp("decode_exits"), tiny_model_dir, decode={"num_pages": 32})
    rt = build_runtime(cfg, cfg.decode.num_pages, use_store=False)
    w = DecodeWorker(rt, rt.cfg.decode, rt.cfg.store, rt.cfg.grpc, "d-test", WorkerRecorder("decode"))
    yield w
    w.close()


def fake_prefill(address, job, timeout_s, is_cancelled):
    return PrefillResult(request_id=job.request_id, first_token_id=42, prompt_tokens=len(job.token_ids))


def boom(*args, **kwargs):
    raise RuntimeError("injected")


STAGES = {
    # stage name: (object path to patch, attribute, replacement)
    "prefill_job": (lambda w: w.rt.pool, "page_addrs", boom),
    "prefill_call": (lambda w: w.prefill_client, "prefill", boom),
    "sampler_state": (lambda w: w.prefill_client, "prefill",
                      lambda a, j, t, c: PrefillResult(j.request_id, 42, len(j.token_ids), sampler_state=b"bad")),
    "page_hashes": (lambda w: decode_worker, "page_hashes", boom),
    "first_token": (lambda w: first_token, "check_stop", boom),
    "join": (lambda w: w.scheduler, "join", boom),
}


@pytest.mark.parametrize("stage", list(STAGES))
def test_an_unexpected_error_at_each_stage_gives_every_page_back(worker, stage, monkeypatch):
    alloc = worker.rt.allocator
    total = alloc.num_total
    target, attr, replacement = STAGES[stage]
    if stage not in ("prefill_job", "prefill_call"):
        monkeypatch.setattr(worker.prefill_client, "prefill", fake_prefill)
    monkeypatch.setattr(target(worker), attr, replacement)
    job = GenerateJob(request_id=f"exit-{stage}", token_ids=tuple(range(10, 60)),
                      params=SamplingParams(temperature=0.0, max_tokens=4, seed=1 if stage == "sampler_state" else None),
                      prefill_address=f"127.0.0.1:{free_port()}", timeout_s=30.0)
    req = worker.create(job)
    with pytest.raises(Exception) as err:
        for _ in worker.run(req):
            pass
    assert "injected" in str(err.value) or stage == "sampler_state"
    deadline = time.monotonic() + 15  # fenced pages: P's closed port must refuse first
    while alloc.num_available() != total:
        assert time.monotonic() < deadline, f"{total - alloc.num_available()} pages leaked at stage {stage}"
        time.sleep(0.05)
    worker.scheduler.call(alloc.check_integrity)
    assert worker.load().active_pages == 0 and req.done


def test_a_request_still_runs_after_the_faults(worker, monkeypatch):
    monkeypatch.setattr(worker.prefill_client, "prefill", fake_prefill)
    job = GenerateJob(request_id="after", token_ids=tuple(range(10, 60)),
                      params=SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True),
                      prefill_address="127.0.0.1:1", timeout_s=30.0)
    events = list(worker.run(worker.create(job)))
    assert sum(len(e.token_ids) for e in events) == 3 and events[-1].finish_reason == "length"
    deadline = time.monotonic() + 10
    while worker.rt.allocator.num_available() != worker.rt.allocator.num_total:
        assert time.monotonic() < deadline, "pages of a finished request never came back"
        time.sleep(0.05)


def test_a_request_aborted_while_it_waits_for_pages_counts_as_aborted(worker):
    """Admission is an exit too: before, a request cancelled in the wait queue was counted nowhere."""
    rec, alloc = worker.recorder, worker.rt.allocator
    failed, aborted = rec.requests_failed, rec.requests_aborted
    hog = worker.scheduler.admit("hog", alloc.num_total, time.monotonic() + 30, lambda: False)
    try:
        job = GenerateJob(request_id="waits", token_ids=tuple(range(10, 60)),
                          params=SamplingParams(temperature=0.0, max_tokens=4),
                          prefill_address="127.0.0.1:1", timeout_s=30.0)
        req = worker.create(job)
        outcome = []
        runner = threading.Thread(target=lambda: outcome.append(_drain(worker.run(req))))
        runner.start()
        deadline = time.monotonic() + 10
        while worker.scheduler.admission.waiting == 0:
            assert time.monotonic() < deadline, "the request never queued for pages"
            time.sleep(0.01)
        assert worker.abort("waits")
        runner.join(10)
        assert not runner.is_alive() and isinstance(outcome[0], Aborted), outcome
    finally:
        worker.scheduler.release(hog)
    assert (rec.requests_failed - failed, rec.requests_aborted - aborted) == (1, 1) and req.done


def _drain(events):
    try:
        for _ in events:
            pass
    except WorkerError as e:  # the outcome under test
        return e
    return None
