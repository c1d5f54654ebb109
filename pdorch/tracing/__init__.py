"""Traces: OpenTelemetry spans of one request across router, decode and prefill (docs/operations.md,
"Reading a trace"). Config: the `observability` section; off by default, and then no tracer at all.

One concept per file:
    setup.py        setup_tracing(cfg, service, instance) -> Tracing (tracer, OTLP batch export, ring, shutdown)
    ring.py         TraceRing: the last keep_traces traces in memory (what `pdorch trace` reads)
    records.py      spans as SpanRecord (proto; the Traces RPC) and as dicts (JSON)
    propagation.py  W3C traceparent/tracestate from HTTP headers and in/out of gRPC metadata
    spans.py        start_span / record_span with explicit parents and times (thread hand-offs)
    deferred.py     spans as plain records until the request ends, then finished spans (the router's hot path)
    names.py        span and attribute names (pdorch.request_id, pdorch.pages.store, ...)
    process.py      the worker process's one Tracing (process_tracing())
    grpc_server.py  the workers' request RPCs as server spans (decode.generate, prefill.prefill)
    grpc_client.py  a sync channel's calls carry the current span (D -> P)

How a worker uses it:
- `pdorch/worker/main.py` sets the process's Tracing up before the worker is built
  (`process_tracing()` returns it anywhere in the process; NO_TRACING in unit tests) and installs
  `RpcSpans`: each Generate / Prefill RPC is a server span, child of the caller's span named by the
  call's `traceparent` metadata, and is the handler thread's current context while the handler runs.
- The servicer takes that context for the request: `trace_ctx = current_trace_ctx()`
  (grpc_server.py; `context_from_grpc(context.invocation_metadata())` gives the caller's span instead),
  and the request/task record keeps it as `trace_ctx` (None when not traced): every span of the
  request is started with `parent=req.trace_ctx`, never from the thread's current context, because the
  request moves grpc thread -> scheduler thread -> I/O threads.
- Spans across hand-offs are started on one thread and ended on another (`start_span(...)`, then
  `span.end()`), or recorded after the fact from times the code measured (`record_span(tracing, name,
  parent, start_ns, end_ns, attributes)`), times from `now_ns()` (unix ns). Work not belonging to one
  request (a write-back batch, an offload) is a span of its own, `links=link_to(req.trace_ctx)`.
- Test `tracing.enabled` before building attributes: with tracing off a span is OpenTelemetry's no-op.
- Attribute names (names.py): `pdorch.request_id` on the request's first span in each process (the
  ring finds a trace by it), `pdorch.pages.<tier>` (device, host, store, ssd, inflight) and
  `pdorch.pages.<miss reason>`, `pdorch.bytes`, `pdorch.keys`, `pdorch.transport`, `pdorch.chunks`.
  Errors: `span.set_status(Status(StatusCode.ERROR, message))`.
- The worker's ring is served by the Traces RPC (`WorkerServicer.Traces` in pdorch/worker/rpc.py:
  `process_tracing().records(trace_id, request_id)`); the router gathers every worker's with its own
  at /admin/traces/{trace_id} (router/http/admin_traces.py).
"""

from pdorch.tracing.names import DECODE_SERVICE, PREFILL_SERVICE, REQUEST_ID, ROUTER_SERVICE
from pdorch.tracing.process import process_tracing, set_process_tracing
from pdorch.tracing.propagation import context_from_grpc, context_from_headers, grpc_metadata, traceparent_of
from pdorch.tracing.setup import NO_TRACING, Tracing, setup_tracing
from pdorch.tracing.spans import context_of, link_to, now_ns, record_span, start_span

__all__ = ["DECODE_SERVICE", "NO_TRACING", "PREFILL_SERVICE", "REQUEST_ID", "ROUTER_SERVICE", "Tracing",
           "context_from_grpc", "context_from_headers", "context_of", "grpc_metadata", "link_to", "now_ns",
           "process_tracing", "record_span", "set_process_tracing", "setup_tracing", "start_span",
           "traceparent_of"]
