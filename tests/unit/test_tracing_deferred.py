"""The router's request spans as plain records until the response is out (pdorch/tracing/deferred.py,
router/dispatch/request_trace.py): the same spans, parents, attributes and statuses as the SDK's, the
SDK's parent-based ratio sampling, and nothing but ids for an unsampled request."""

from __future__ import annotations

import json

from pdorch.config import ObservabilityConfig
from pdorch.tracing import setup_tracing
from pdorch.tracing.names import REQUEST_ID
from router.dispatch.request_trace import RequestTrace

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


class Worker:  # what a trace reads of one
    def __init__(self, address: str, load: int):
        self.address, self.load = address, load


class Outcome:  # a finished sequence's Progress, the fields a trace reads
    preemptions, output_ids, finish_reason = 1, [5, 6, 7], "stop"
    device, host, store, ssd, inflight = 16, 0, 32, 0, 0


def _tracing(ratio: float):
    return setup_tracing(ObservabilityConfig(keep_traces=8, sample_ratio=ratio), "pdorch-router", "r1")


def _served(tracing, traceparent: str | None = None, tracestate: str | None = None, failover: bool = False):
    p, d, d2 = Worker("p:1", 2), Worker("d:1", 3), Worker("d:2", 0)
    rt = RequestTrace(tracing, traceparent, tracestate, "/v1/chat/completions", "tiny")
    rt.request("req-1", 40)
    calls = [rt.attempt(p, d, "cache_aware", "prefix", [p, d], False)]
    if failover:
        rt.failover("UNAVAILABLE: decode died", 4)
        calls.append(rt.attempt(p, d2, "cache_aware", "resume", [p], True))
    rt.finished([Outcome()])
    rt.end(200)
    return rt, calls


def test_a_sampled_request_is_a_request_span_and_its_attempts_with_their_parents_and_attributes():
    tracing = _tracing(1.0)
    rt, calls = _served(tracing, failover=True)
    records = {(r.name, r.span_id): r for r in tracing.records(request_id="req-1")}
    [root] = [r for (name, _), r in records.items() if name == "router.request"]
    attempts = sorted((r for (name, _), r in records.items() if name == "router.attempt"),
                      key=lambda r: r.start_unix_ns)
    assert len(records) == 3 and root.parent_span_id == ""
    assert rt.traceparent().decode() == f"00-{root.trace_id}-{root.span_id}-01"
    # each Generate call names its own attempt span, whose parent is the request's
    assert [dict(c)["traceparent"] for c in calls] == [f"00-{root.trace_id}-{a.span_id}-01" for a in attempts]
    assert {a.parent_span_id for a in attempts} == {root.span_id}
    first, second = (json.loads(a.attributes_json) for a in attempts)
    assert (attempts[0].status_code, attempts[0].status_message) == (2, "UNAVAILABLE: decode died")
    assert attempts[1].status_code == 0 and second["pdorch.resumed"] is True
    assert first["pdorch.policy.scores"] == "p:1 load=2, d:1 load=3" and first["pdorch.decode"] == "d:1"
    attributes = json.loads(root.attributes_json)
    assert attributes[REQUEST_ID] == "req-1" and attributes["pdorch.decode"] == "d:2"
    assert (attributes["pdorch.failovers"], attributes["pdorch.completion_tokens"]) == (1, 3)
    assert (attributes["pdorch.cached_tokens.store"], attributes["http.response.status_code"]) == (32, 200)
    assert root.start_unix_ns <= attempts[0].start_unix_ns <= attempts[1].end_unix_ns <= root.end_unix_ns


def test_an_error_status_is_the_code_the_client_saw():
    tracing = _tracing(1.0)
    rt = RequestTrace(tracing, None, None, "/v1/chat/completions", "tiny")
    rt.request("req-2", 4)
    rt.end(404, "model_not_found", "no model named x")
    [root] = tracing.records(request_id="req-2")
    assert (root.status_code, root.status_message) == (2, "no model named x")
    assert json.loads(root.attributes_json)["pdorch.error.code"] == "model_not_found"


def test_ratio_zero_records_nothing_and_sends_the_unsampled_ids_on():
    tracing = _tracing(0.0)
    rt, [call] = _served(tracing)
    assert rt.span is None and tracing.ring.slowest(10) == []
    version, trace_id, span_id, flags = rt.traceparent().decode().split("-")
    assert (version, flags, len(trace_id), len(span_id)) == ("00", "00", 32, 16)
    assert call == (("traceparent", rt.traceparent().decode()),)  # D follows the decision: unsampled


def test_a_client_parent_decides_whatever_the_ratio():
    sampled = _tracing(0.0)
    rt, [call] = _served(sampled, f"00-{TRACE_ID}-{CLIENT_SPAN}-01", "vendor=1")
    [root] = [r for r in sampled.records(TRACE_ID) if r.name == "router.request"]
    assert root.parent_span_id == CLIENT_SPAN and rt.traceparent().decode().startswith(f"00-{TRACE_ID}-")
    assert dict(call)["tracestate"] == "vendor=1"
    unsampled = _tracing(1.0)
    rt, _ = _served(unsampled, f"00-{TRACE_ID}-{CLIENT_SPAN}-00")
    assert unsampled.records(TRACE_ID) == [] and rt.traceparent().decode().endswith("-00")


def test_a_malformed_traceparent_starts_a_new_sampled_trace():
    tracing = _tracing(1.0)
    rt, _ = _served(tracing, "00-not-a-trace-01")
    [root] = [r for r in tracing.records(request_id="req-1") if r.name == "router.request"]
    assert root.parent_span_id == "" and root.trace_id == rt.traceparent().decode().split("-")[1]


def test_the_ratio_samples_about_its_share_of_new_traces():
    tracing = _tracing(0.25)
    sampled = sum(RequestTrace(tracing, None, None, "/generate", "tiny").sampled for _ in range(4000))
    assert 800 < sampled < 1200  # 1000 expected; the bounds are > 6 standard deviations (27) away


def test_the_routers_log_lines_name_the_request_trace_set_on_its_task():
    import logging

    from pdorch.tracing.log_filter import REQUEST_TRACE_ID, TraceIdFilter

    record = logging.LogRecord("pdorch.router", logging.WARNING, __file__, 1, "about the request", (), None)
    token = REQUEST_TRACE_ID.set(int(TRACE_ID, 16))  # as router/http/hot_path.py does for each traced request
    try:
        TraceIdFilter().filter(record)
    finally:
        REQUEST_TRACE_ID.reset(token)
    assert record.trace == f" trace={TRACE_ID}"
    TraceIdFilter().filter(record)
    assert record.trace == ""  # outside any request
