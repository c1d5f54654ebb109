"""pdorch/tracing: W3C propagation, the in-memory ring, span records, the worker RPCs' server spans."""

from __future__ import annotations

import concurrent.futures
import json

import grpc
import pytest
from opentelemetry import trace

from pdorch.config import ObservabilityConfig
from pdorch.tracing import (
    NO_TRACING,
    context_from_grpc,
    context_from_headers,
    context_of,
    grpc_metadata,
    link_to,
    record_span,
    setup_tracing,
    start_span,
    traceparent_of,
)
from pdorch.tracing.grpc_client import SendTraceContext
from pdorch.tracing.grpc_server import RpcSpans, current_trace_ctx
from pdorch.tracing.names import REQUEST_ID

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def _tracing(**kw):
    return setup_tracing(ObservabilityConfig(keep_traces=kw.pop("keep_traces", 8), **kw), "pdorch-test", "t1")


def _trace_id(ctx) -> str:
    return f"{trace.get_current_span(ctx).get_span_context().trace_id:032x}"


def test_off_by_default_is_the_no_op_tracer():
    assert setup_tracing(ObservabilityConfig(), "pdorch-router", "r") is NO_TRACING
    assert not NO_TRACING.enabled and NO_TRACING.records(TRACE_ID) == []
    assert not NO_TRACING.tracer.start_span("x").get_span_context().is_valid


def test_a_client_traceparent_is_the_parent():
    ctx = context_from_headers(PARENT, "vendor=1")
    assert _trace_id(ctx) == TRACE_ID
    tracing = _tracing()
    span = start_span(tracing, "router.request", ctx)
    span.end()
    assert traceparent_of(span).startswith(f"00-{TRACE_ID}-") and traceparent_of(span).endswith("-01")
    [record] = tracing.records(TRACE_ID)
    assert record.parent_span_id == "00f067aa0ba902b7"


@pytest.mark.parametrize("bad", ["", "garbage", "00-xyz-00f067aa0ba902b7-01", f"00-{'0' * 32}-00f067aa0ba902b7-01",
                                 f"00-{TRACE_ID}-0000000000000000-01", f"ff-{TRACE_ID}-00f067aa0ba902b7-01",
                                 f"00-{TRACE_ID}-00f067aa0ba902b7"])
def test_a_malformed_traceparent_is_no_parent(bad):
    assert context_from_headers(bad, "a=b") is None
    assert context_from_grpc([("traceparent", bad)]) is None


def test_grpc_metadata_round_trip():
    tracing = _tracing()
    span = start_span(tracing, "router.request", None)
    metadata = grpc_metadata(context_of(span))
    assert [k for k, _ in metadata] == ["traceparent"]
    got = trace.get_current_span(context_from_grpc([("authorization", "Bearer x"), *metadata])).get_span_context()
    assert (got.trace_id, got.span_id) == (span.get_span_context().trace_id, span.get_span_context().span_id)
    assert grpc_metadata(None) == () and grpc_metadata(context_of(NO_TRACING.tracer.start_span("x"))) == ()
    assert context_from_grpc(None) is None and context_from_grpc([("authorization", "x")]) is None


def test_the_ring_keeps_the_last_n_traces_and_finds_them_by_request_id():
    tracing = _tracing(keep_traces=2, max_spans_per_trace=3)
    roots = []
    for i in range(3):
        root = start_span(tracing, "router.request", None, {REQUEST_ID: f"req-{i}"})
        for j in range(5):
            record_span(tracing, f"child-{j}", context_of(root), 10 + j, 20 + j)
        root.end()
        roots.append(f"{root.get_span_context().trace_id:032x}")
    assert tracing.records(roots[0]) == []  # the oldest trace went
    assert tracing.records(request_id="req-0") == []
    kept = tracing.records(request_id="req-2")
    assert len(kept) == 3 and {r.trace_id for r in kept} == {roots[2]}  # max_spans_per_trace
    assert [r.start_unix_ns for r in kept] == sorted(r.start_unix_ns for r in kept)
    assert tracing.ring.slowest(5) and len(tracing.ring.slowest(5)) == 2


def test_sample_ratio_zero_keeps_nothing_but_a_sampled_parent_is_followed():
    tracing = _tracing(sample_ratio=0.0)
    start_span(tracing, "new trace", None).end()
    assert tracing.ring.slowest(10) == []
    start_span(tracing, "parent sampled", context_from_headers(PARENT)).end()
    assert [r.name for r in tracing.records(TRACE_ID)] == ["parent sampled"]


def test_span_record_fields():
    tracing = _tracing()
    root = start_span(tracing, "root", None, {REQUEST_ID: "r1", "pdorch.pages.store": 3, "list": ("a", "b")})
    record_span(tracing, "failed", context_of(root), 100, 250, {"pdorch.bytes": 4096}, error="store unavailable",
                links=link_to(context_from_headers(PARENT)))
    root.end()
    root_rec, failed = sorted(tracing.records(request_id="r1"), key=lambda r: r.name != "root")
    assert (root_rec.service, root_rec.instance, root_rec.parent_span_id) == ("pdorch-test", "t1", "")
    assert json.loads(root_rec.attributes_json) == {REQUEST_ID: "r1", "pdorch.pages.store": 3, "list": ["a", "b"]}
    assert failed.parent_span_id == root_rec.span_id and (failed.start_unix_ns, failed.end_unix_ns) == (100, 250)
    assert (failed.status_code, failed.status_message) == (2, "store unavailable")
    assert [(link.trace_id, link.span_id) for link in failed.links] == [(TRACE_ID, "00f067aa0ba902b7")]


def test_worker_rpcs_are_server_spans_and_carry_the_context_on():
    """A Prefill-shaped RPC through the real grpc server with RpcSpans: its span is the child of the
    caller's traceparent, is the handler's current context, and a call the handler makes carries it on."""
    tracing = _tracing()
    seen = {}

    def prefill(request, context):
        seen["ctx"] = current_trace_ctx()
        seen["metadata"] = grpc_metadata(seen["ctx"])
        if request == b"fail":
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full")
        return request

    def generate(request, context):
        yield b"1"
        seen["streamed_ctx"] = current_trace_ctx()
        yield b"2"

    server = grpc.server(concurrent.futures.ThreadPoolExecutor(2), interceptors=[RpcSpans(tracing)])
    server.add_generic_rpc_handlers([  # bytes in, bytes out: no serializers
        grpc.method_handlers_generic_handler("pdorch.v1.DecodeService", {
            "Generate": grpc.unary_stream_rpc_method_handler(generate)}),
        grpc.method_handlers_generic_handler("pdorch.v1.PrefillService", {
            "Prefill": grpc.unary_unary_rpc_method_handler(prefill)})])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        channel = grpc.intercept_channel(grpc.insecure_channel(f"127.0.0.1:{port}"), SendTraceContext())
        call = channel.unary_unary("/pdorch.v1.PrefillService/Prefill")
        assert call(b"x", metadata=[("traceparent", PARENT)], timeout=5) == b"x"
        assert _trace_id(seen["ctx"]) == TRACE_ID
        with pytest.raises(grpc.RpcError):
            call(b"fail", metadata=[("traceparent", PARENT)], timeout=5)
        assert list(channel.unary_stream("/pdorch.v1.DecodeService/Generate")(
            b"", metadata=[("traceparent", PARENT)], timeout=5)) == [b"1", b"2"]
        assert _trace_id(seen["streamed_ctx"]) == TRACE_ID
        # a call made where a span is current carries it (D's Prefill on its Generate thread)
        parent = start_span(tracing, "decode.generate", None)
        from opentelemetry import context as otel_context

        token = otel_context.attach(context_of(parent))
        try:
            call(b"y", timeout=5)
        finally:
            otel_context.detach(token)
        assert _trace_id(seen["ctx"]) == f"{parent.get_span_context().trace_id:032x}"
        channel.close()
    finally:
        server.stop(None)
    records = tracing.records(TRACE_ID)
    assert sorted(r.name for r in records) == ["decode.generate", "prefill.prefill", "prefill.prefill"]
    assert {r.parent_span_id for r in records} == {"00f067aa0ba902b7"}
    failed = [r for r in records if r.status_code == 2]
    assert len(failed) == 1 and failed[0].status_message == "RESOURCE_EXHAUSTED: queue full"


def test_log_lines_about_a_traced_request_name_its_trace():
    import logging

    from opentelemetry import context as otel_context

    from pdorch.tracing.log_filter import TraceIdFilter

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    handler.addFilter(TraceIdFilter())
    log = logging.getLogger("test_tracing_core.log")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("outside any request")
        span = start_span(_tracing(), "router.request", context_from_headers(PARENT))
        token = otel_context.attach(context_of(span))
        try:
            log.warning("about the request")
        finally:
            otel_context.detach(token)
    finally:
        log.removeHandler(handler)
    assert [r.trace for r in records] == ["", f" trace={TRACE_ID}"]
