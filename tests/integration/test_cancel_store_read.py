"""A request cancelled while the decode worker's own store read of its prefix is in flight ends at
once (decode_node/prefix_load.py: the read is abandoned), and the pages the read writes into go back
to the pool only when it lands: none freed while Mooncake may still write into it, none leaked.

How the read is held in flight, with the real store: the decode worker is a pure store client
(no segment), so every page lives in the prefill worker's segment; the prefill worker is stopped
(SIGSTOP) and the decode worker's read from its segment waits until it is continued. The request's
prompt is a stored prefix plus a short tail: the decode worker reads the prefix itself and computes
the tail (a local plan: no prefill call, which the stopped worker could not answer).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import uuid

import grpc
import pytest

from pdorch.local_stack.workers import WorkerCluster, make_config, worker_metric
from proto.pdorch.v1 import worker_pb2 as pb
from store_client.master import MasterProcess

PREFIX = [(i * 29) % 900 + 20 for i in range(320)]  # 20 pages of 16 tokens
PROMPT = PREFIX + [7, 8, 9, 10, 11]  # the tail: computed by the decode worker itself
FREED_WITHIN_S = 0.1
DEADLINE_S = 1.0  # the "deadline" case's request timeout


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, tiny_model_dir):
    tmp = tmp_path_factory.mktemp("cancel_read")
    master = MasterProcess(log_dir=str(tmp)).start()
    c = WorkerCluster(make_config(tmp, tiny_model_dir, master), tmp, master)
    with c.stopped_on_failure():
        c.wait_ready(c.spawn_worker("prefill"), c.spawn_worker("decode", sections={"store": {"global_segment_size_mb": 0}}))
    yield c
    c.stop()


@contextlib.contextmanager
def stopped(proc):
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(proc.pid, signal.SIGCONT)


def info(cluster) -> pb.WorkerInfo:
    return cluster.decode_stub().Info(pb.InfoRequest(), timeout=5)


def until(cond, timeout_s: float, what: str) -> float:
    """Poll `cond()` every 2 ms; the seconds it took (fails naming `what` after `timeout_s`)."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout_s:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.002)
    return time.monotonic() - t0


@pytest.mark.parametrize("how", ["caller_gone", "abort", "deadline"])
def test_a_cancel_during_the_store_read_frees_the_request_at_once_and_its_pages_when_the_read_lands(cluster, how):
    cluster.generate(PREFIX + [1, 2, 3], max_tokens=2)  # P computes the prefix and writes it to the store
    cluster.flush_l1()  # D finds the prefix in the store only
    free_at_start = info(cluster).free_pages
    local = worker_metric(cluster.decode, "pdorch_decode_prompt_plans_total", where="local")
    outcome = "failed" if how == "deadline" else "aborted"
    ended = worker_metric(cluster.decode, "pdorch_decode_requests_total", outcome=outcome)
    rid = uuid.uuid4().hex
    req = pb.GenerateRequest(request_id=rid, token_ids=PROMPT, prefill_address=cluster.prefill.address,
                             sampling=pb.SamplingParams(max_tokens=8, temperature=0.0),
                             timeout_s=DEADLINE_S if how == "deadline" else 60)
    chunks: list = []
    with stopped(cluster.prefill.proc):
        sent = time.monotonic()
        call = cluster.decode_stub().Generate(req, timeout=60)
        reader = threading.Thread(target=lambda: chunks.extend(_drain(call)), daemon=True)
        reader.start()
        admitted = sent + until(lambda: info(cluster).running_requests == 1, 10, "the request to be admitted")
        until(lambda: worker_metric(cluster.decode, "pdorch_decode_prompt_plans_total", where="local") > local, 10,
              "the decode worker to plan reading the prefix itself")
        time.sleep(0.3)
        assert not chunks and info(cluster).running_requests == 1  # held by the read, not answered
        if how == "abort":
            assert cluster.decode_stub().Abort(pb.AbortRequest(request_id=rid), timeout=5).found
        elif how == "caller_gone":
            call.cancel()
        # NOTE: D's deadline starts when D takes the call, between `sent` and `admitted` (under load that
        # can be hundreds of ms after `sent`: a run measured 657 ms "late" from `sent`); its latest moment
        cancelled = time.monotonic() if how != "deadline" else admitted + DEADLINE_S
        until(lambda: info(cluster).running_requests == 0 and info(cluster).queued_requests == 0, 5,
              "the request to end")
        took = time.monotonic() - cancelled
        assert took < FREED_WITHIN_S, f"the request ended {took * 1000:.0f} ms after the {how}"
        assert worker_metric(cluster.decode, "pdorch_decode_requests_total", outcome=outcome) == ended + 1
        # the read's pages stay out of the pool while Mooncake may still write into them
        time.sleep(0.2)
        assert info(cluster).free_pages < free_at_start
    reader.join(10)
    until(lambda: info(cluster).free_pages == free_at_start, 15, "the read's pages to come back when it lands")
    cluster.assert_pools_sound()


def _drain(call) -> list:
    try:
        return list(call)
    except grpc.RpcError:
        return []
