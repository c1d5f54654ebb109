"""The decode worker's spans of a traced request (decode_node/spans.py), kept in the process's in-memory
ring: a real DecodeWorker (tiny model, no store; P's answer a small fake, as in test_decode_exits.py)
and the real DecodeScheduler with the held store I/O of test_decode_scheduler.py."""

from __future__ import annotations

import time

import pytest
from opentelemetry import trace

from decode_node import spans as decode_spans
from decode_node.request import GenerateJob
from decode_node.worker import DecodeWorker
from engine.sampling_params import SamplingParams
from pdorch.config import ObservabilityConfig
from pdorch.local_stack.router import wait_until
from pdorch.local_stack.workers import make_config
from pdorch.tracing import context_of, set_process_tracing, setup_tracing, start_span
from pdorch.tracing import names as n
from pdorch.tracing.setup import NO_TRACING
from pdorch.worker.metrics import WorkerRecorder
from pdorch.worker.prefill_rpc import CachedTokens, PrefillResult
from pdorch.worker.prompt_pages import compute_ranges, computed_full_pages, reusable_pages
from pdorch.worker.runtime import build_runtime
from tests.unit.test_decode_scheduler import (
    HeldStoreIO,
    admitted,
    events_until_final,
    load_tiny,
    start_scheduler,
)

PROMPT = tuple(range(10, 60))  # 50 tokens


@pytest.fixture
def tracing():
    t = setup_tracing(ObservabilityConfig(keep_traces=16), n.DECODE_SERVICE, "d1")
    set_process_tracing(t)
    yield t
    set_process_tracing(NO_TRACING)
    t.shutdown()


@pytest.fixture(scope="module")
def worker(tmp_path_factory, tiny_model_dir):
    cfg = make_config(tmp_path_factory.mktemp("decode_spans"), tiny_model_dir, decode={"num_pages": 32})
    rt = build_runtime(cfg, cfg.decode.num_pages, use_store=False)
    w = DecodeWorker(rt, rt.cfg.decode, rt.cfg.store, rt.cfg.grpc, "d-spans", WorkerRecorder("decode"))
    yield w
    w.close()


def fake_prefill(address, job, timeout_s, is_cancelled):
    return PrefillResult(request_id=job.request_id, first_token_id=42, prompt_tokens=len(job.token_ids),
                         cached=CachedTokens())


def run_traced(tracing, worker, rid, max_tokens=4, stop_after=None):
    rpc = start_span(tracing, "decode.generate", None)
    job = GenerateJob(request_id=rid, token_ids=PROMPT, params=SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                                                                ignore_eos=True),
                      prefill_address="127.0.0.1:1", timeout_s=30.0)
    req = worker.create(job, context_of(rpc))
    events = []
    stream = worker.run(req)
    for event in stream:
        events.append(event)
        if stop_after is not None and len(events) == stop_after:
            stream.close()  # the consumer goes away (the router's client)
            break
    rpc.end()
    return rpc, events, {s.name: s for s in tracing.ring.spans(rpc.get_span_context().trace_id)}


def test_a_request_shows_admission_plan_first_token_and_stream_end_under_its_rpc_span(tracing, worker, monkeypatch):
    monkeypatch.setattr(worker.prefill_client, "prefill", fake_prefill)
    rpc, events, spans = run_traced(tracing, worker, "d-traced")
    assert events[-1].finish_reason == "length"
    rpc_id = rpc.get_span_context().span_id
    for name in (n.DECODE_ADMISSION, n.DECODE_PREFIX, n.DECODE_FIRST_TOKEN, n.DECODE_STREAM):
        assert spans[name].parent.span_id == rpc_id, name
    assert spans["decode.generate"].attributes[n.REQUEST_ID] == "d-traced"
    page_size = worker.rt.page_size
    prefix = spans[n.DECODE_PREFIX].attributes
    # no store: every reusable page is P's, the plan says why
    assert prefix[n.PLAN] == "prefill:store_off"
    assert prefix["pdorch.pages.prefill"] == reusable_pages(len(PROMPT), page_size) and prefix["pdorch.pages.device"] == 0
    stream = spans[n.DECODE_STREAM]
    assert (stream.attributes[n.FINISH_REASON], stream.attributes[n.TOKENS]) == ("length", 4)
    assert stream.status.status_code == trace.StatusCode.UNSET
    assert spans[n.DECODE_FIRST_TOKEN].end_time <= stream.start_time + 1  # the stream starts at the first token


def test_a_stream_the_consumer_leaves_ends_cancelled(tracing, worker, monkeypatch):
    monkeypatch.setattr(worker.prefill_client, "prefill", fake_prefill)
    _, events, spans = run_traced(tracing, worker, "d-left", max_tokens=50, stop_after=1)
    assert len(events) == 1
    assert spans[n.DECODE_STREAM].attributes[n.FINISH_REASON] == "cancelled"


def test_an_untraced_request_records_nothing(tracing, worker, monkeypatch):
    monkeypatch.setattr(worker.prefill_client, "prefill", fake_prefill)
    job = GenerateJob(request_id="d-plain", token_ids=PROMPT, params=SamplingParams(temperature=0.0, max_tokens=2),
                      prefill_address="127.0.0.1:1", timeout_s=30.0)
    req = worker.create(job)
    assert [e for e in worker.run(req)][-1].final
    assert tracing.ring._traces == {}


@pytest.fixture(scope="module")
def model(tmp_path_factory, tiny_model_dir):
    return load_tiny(tmp_path_factory.mktemp("decode_spans_sched"), tiny_model_dir)


def test_a_step_write_is_its_own_span_linked_to_the_request_and_a_preemption_is_recorded(tracing, model):
    io = HeldStoreIO()
    sched, _ = start_scheduler(model, 8, store_io=io)
    prompt = list(range(40, 104))  # 64 tokens: 4 full pages, computed here and written in one step write
    try:
        rpc = start_span(tracing, "decode.generate", None)
        req = admitted(sched, model[3], "d-write", prompt, 4)
        req.trace_ctx = context_of(rpc)
        holes = list(range(reusable_pages(len(prompt), 16)))
        req.compute.plan(compute_ranges(holes, len(prompt), 16), computed_full_pages(holes, len(prompt), 16),
                         sample_first=True)
        sched.join(req)
        assert events_until_final(req)[-1].finish_reason == "length"
        wait_until(lambda: io.held, 10, "the step write submitted")
        io.release()
        wait_until(lambda: any(s.name == n.DECODE_STORE_WRITE for t in list(tracing.ring._traces)
                               for s in tracing.ring.spans(t)), 10, "the step write's span")
    finally:
        sched.stop()
    [write] = [s for t in list(tracing.ring._traces) for s in tracing.ring.spans(t) if s.name == n.DECODE_STORE_WRITE]
    assert write.context.trace_id != rpc.get_span_context().trace_id  # its own trace ...
    assert [link.context.span_id for link in write.links] == [rpc.get_span_context().span_id]  # ... linked
    assert (write.attributes[n.PAGES_WRITTEN], write.attributes[n.WRITE_KIND]) == (4, "writeback")
    # a preemption: an event on the request's span, then decode.preempted from preempt to resume
    req.preempt.count, req.preempt.paused_since = 1, time.monotonic() - 0.05
    decode_spans.preempted(req)
    decode_spans.resumed(req, req.preempt.paused_since)
    rpc.end()
    spans = {s.name: s for s in tracing.ring.spans(rpc.get_span_context().trace_id)}
    assert [e.name for e in spans["decode.generate"].events] == [n.DECODE_PREEMPTED]
    paused = spans[n.DECODE_PREEMPTED]
    assert paused.end_time - paused.start_time >= 40_000_000 and paused.attributes[n.PREEMPTIONS] == 1
