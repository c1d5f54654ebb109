"""The decode worker keeps a failed prefill's pages out of its pool until the prefill worker confirms
that no KV write into them can land (hazard 1 of issue 14).

A real decode worker process (tiny model, real pool and transfer engine) against a prefill worker
that keeps "pushing": a gRPC PrefillService in this process whose Prefill never answers and whose
Abort (D's confirmation question) says "push still running" until the test ends the push. The
prefill worker's own side (answers only after its push returned) is tests/unit/test_prefill_push_fence.py.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
import urllib.request

import grpc
import pytest

from pdorch.local_stack.processes import free_port
from pdorch.local_stack.workers import WorkerCluster, make_config
from proto.pdorch.v1 import worker_pb2 as pb
from proto.pdorch.v1 import worker_pb2_grpc as pb_grpc

PAGE_SIZE = 16


class StuckPrefill(pb_grpc.PrefillServiceServicer):
    """A prefill worker whose push into D's pages runs until `push_over` is set."""

    def __init__(self):
        self.push_over = threading.Event()
        self.prefills = 0
        self.aborts = 0
        self.answer_after_s: float | None = None

    def Prefill(self, request, context):
        self.prefills += 1
        if self.answer_after_s is not None:  # a slow but healthy prefill: the KV lands, then the answer
            time.sleep(self.answer_after_s)
            return pb.PrefillResponse(request_id=request.request_id, first_token_id=42,
                                      prompt_tokens=len(request.token_ids))
        while context.is_active() and not self.push_over.wait(0.05):
            pass
        context.abort(grpc.StatusCode.CANCELLED, "gave up")

    def Abort(self, request, context):
        self.aborts += 1
        if not self.push_over.wait(0.2):
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "KV push still running")
        return pb.AbortResponse(found=True)


@pytest.fixture(scope="module")
def decode(tmp_path_factory, tiny_model_dir):
    tmp = tmp_path_factory.mktemp("decode_fence")
    # prefill_timeout_s far below the requests' own deadlines: it must not fail them (one deadline).
    cfg = make_config(tmp, tiny_model_dir, decode={"prefill_timeout_s": 1.0})
    cluster = WorkerCluster(cfg=cfg, tmp=tmp, master=None)
    try:
        wp = cluster.spawn_worker("decode")
        cluster.wait_ready(wp)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def stuck_prefill():
    servicer = StuckPrefill()
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_PrefillServiceServicer_to_server(servicer, server)
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    servicer.push_over.set()
    server.stop(grace=0).wait(5)


def metric(cluster, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{cluster.decode.metrics_port}/metrics", timeout=10).read()
    for line in text.decode().splitlines():
        if line.startswith((name + " ", name + "{")):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def test_pages_a_prefill_may_still_write_stay_out_of_the_pool_until_it_confirms(decode, stuck_prefill):
    servicer, address = stuck_prefill
    prompt = [(i * 31) % 1000 + 10 for i in range(50)]  # 4 pages + the spare page of the first token
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as err:
        decode.generate(prompt, max_tokens=4, timeout_s=1.0, prefill_address=address)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - t0 < 5.0
    # Long past the old fixed 2 s quarantine, P still "pushes": the pages must not be reusable.
    time.sleep(3.0)
    st = decode.stats("decode")
    assert st.info.total_pages - st.info.free_pages == 4
    assert metric(decode, "pdorch_decode_fence_pending_pages") == 4
    assert servicer.aborts >= 2  # D keeps asking
    servicer.push_over.set()  # the push returned: the next Abort confirms
    st = decode.wait_idle("decode", timeout_s=10)
    assert st.pool_integrity_ok, st.pool_integrity_error
    assert st.info.free_pages == st.info.total_pages
    assert metric(decode, 'pdorch_decode_fenced_pages_total{outcome="confirmed"}') == 4
    assert metric(decode, "pdorch_decode_fence_pending_pages") == 0


def test_the_requests_own_deadline_governs_the_prefill_not_decode_prefill_timeout_s(decode, stuck_prefill):
    servicer, address = stuck_prefill
    servicer.answer_after_s = 2.5  # > decode.prefill_timeout_s (1 s), well within the request's 60 s
    res = decode.generate([(i * 17) % 1000 + 10 for i in range(40)], max_tokens=3, timeout_s=60.0,
                          prefill_address=address, ignore_eos=True)
    assert len(res.token_ids) == 3 and res.finish_reason == "length"
    st = decode.wait_idle("decode", timeout_s=10)
    assert st.info.free_pages == st.info.total_pages
