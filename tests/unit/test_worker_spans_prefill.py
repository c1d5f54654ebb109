"""The prefill worker's spans of a traced task (prefill_node/spans.py), kept in the process's in-memory
ring: the real PrefillScheduler with the small fakes of test_prefill_scheduler.py."""

from __future__ import annotations

import pytest
from opentelemetry import trace

from pdorch.config import ObservabilityConfig
from pdorch.tracing import context_of, set_process_tracing, setup_tracing, start_span
from pdorch.tracing import names as n
from pdorch.tracing.setup import NO_TRACING
from pdorch.tracing.worker_spans import page_misses
from store_client.io_thread import IOCompletion
from store_client.page_hash import page_hashes, store_key
from tests.unit.test_prefill_scheduler import PAGE_SIZE, FakeStoreIO, make, settle, submit


@pytest.fixture
def tracing():
    t = setup_tracing(ObservabilityConfig(keep_traces=16), n.PREFILL_SERVICE, "p1")
    set_process_tracing(t)
    yield t
    set_process_tracing(NO_TRACING)
    t.shutdown()


def traced_submit(tracing, sched, tokens, rid):
    """Submit as PrefillServicer.Prefill does: the task keeps the RPC span's context (here a span of the test's)."""
    rpc = start_span(tracing, "prefill.prefill", None)
    task = submit(sched, tokens, rid, trace_ctx=context_of(rpc))
    return rpc, task


def spans_of(tracing, rpc):
    return {s.name: s for s in tracing.ring.spans(rpc.get_span_context().trace_id)}


def test_a_store_hit_with_a_hole_shows_queue_prefix_read_compute_push_and_a_linked_write_back(tracing):
    tokens = list(range(300, 318))  # 18 tokens: 4 reusable full pages, the tail on page 4
    keys = [store_key("fp", h) for h in page_hashes(tokens, PAGE_SIZE)]
    io = FakeStoreIO(present=[keys[0], keys[1], keys[3]])  # page 2 is not in the store
    sched, rt, _ = make(store_io=io)
    try:
        rpc, task = traced_submit(tracing, sched, tokens, "r-hole")
        task.future.result(5)
        settle(sched, rt)
        rpc.end()
    finally:
        sched.stop()
    spans = spans_of(tracing, rpc)
    assert {n.PREFILL_QUEUE, n.PREFILL_PREFIX, n.PREFILL_STORE_READ, n.PREFILL_COMPUTE, n.PREFILL_PUSH,
            "prefill.prefill"} <= set(spans)
    rpc_id = rpc.get_span_context().span_id
    for name in (n.PREFILL_QUEUE, n.PREFILL_PREFIX, n.PREFILL_STORE_READ, n.PREFILL_COMPUTE, n.PREFILL_PUSH):
        assert spans[name].parent.span_id == rpc_id, name
    prefix = spans[n.PREFILL_PREFIX].attributes
    assert (prefix["pdorch.pages.store"], prefix["pdorch.pages.device"], prefix[n.PAGES_HOLES]) == (3, 0, 1)
    assert prefix["pdorch.pages.not_in_store"] == 1
    read = spans[n.PREFILL_STORE_READ].attributes
    assert (read[n.KEYS], read["pdorch.pages.store"], read["pdorch.pages.not_in_store"]) == (4, 3, 1)
    assert read[n.BYTES] == 3 * rt.pool.page_nbytes
    assert spans[n.PREFILL_COMPUTE].attributes[n.CHUNKS] == 1  # the hole and the tail share one forward
    assert spans[n.PREFILL_COMPUTE].attributes[n.TOKENS] == 6
    push = spans[n.PREFILL_PUSH].attributes
    assert push[n.BYTES] == 5 * 100 and push[n.TRANSPORT]  # 5 prompt pages x the pusher's page bytes
    assert spans[n.PREFILL_QUEUE].attributes[n.REQUEST_ID] == "r-hole"
    # the write-back: a span of its own (another trace), linked to the request's span
    [write] = [s for s in tracing.ring.spans(_only_other_trace(tracing, rpc)) if s.name == n.PREFILL_STORE_WRITE]
    assert [link.context.span_id for link in write.links] == [rpc_id]
    assert write.attributes[n.PAGES_WRITTEN] == 1 and write.attributes[n.LINKED_REQUESTS] == ("r-hole",)


def _only_other_trace(tracing, rpc) -> int:
    [other] = [t for t in tracing.ring._traces if t != rpc.get_span_context().trace_id]
    return other


def test_a_store_that_cannot_answer_reports_every_page_as_store_unavailable(tracing):
    tokens = list(range(40, 53))  # 3 reusable pages
    io = FakeStoreIO()
    io.submit_load = lambda tag, keys, addrs: io._deliver(
        IOCompletion(tag, "load", 0, "disabled", len(keys), page_ok=(False,) * len(keys)), False)
    sched, rt, _ = make(store_io=io)
    try:
        rpc, task = traced_submit(tracing, sched, tokens, "r-down")
        task.future.result(5)
        settle(sched, rt)
        rpc.end()
    finally:
        sched.stop()
    spans = spans_of(tracing, rpc)
    assert spans[n.PREFILL_PREFIX].attributes["pdorch.pages.store_unavailable"] == 3
    read = spans[n.PREFILL_STORE_READ]
    assert read.status.status_code == trace.StatusCode.ERROR and read.attributes[n.STORE_RESULT] == "disabled"


def test_an_untraced_task_records_nothing(tracing):
    sched, rt, _ = make()
    try:
        submit(sched, list(range(10, 20)), "plain").future.result(5)
        settle(sched, rt)
    finally:
        sched.stop()
    assert tracing.ring._traces == {}


def test_per_page_store_reasons_become_miss_reasons():
    done = IOCompletion(None, "load", 1, "absent", 4, page_ok=(True, False, False, False),
                        miss_reasons=("absent", "size_mismatch", "timeout"))
    assert page_misses(done, 4) == [n.MISS_NOT_IN_STORE, n.MISS_LAYOUT_MISMATCH, n.MISS_STORE_UNAVAILABLE]
    # a completion without per-page reasons (a load that timed out queued): every miss its reason
    assert page_misses(IOCompletion(None, "load", 0, "timeout", 2), 2) == [n.MISS_STORE_UNAVAILABLE] * 2
