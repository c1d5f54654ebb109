"""The worker's request RPCs as server spans: `decode.generate` (DecodeService.Generate, the whole stream)
and `prefill.prefill` (PrefillService.Prefill), children of the caller's span its `traceparent` metadata
names (a new trace without one).

The interceptor makes the RPC's span the current context of the handler thread while the handler runs,
so `current_trace_ctx()` in a servicer is the context the request record keeps (`trace_ctx`), and a call
the handler thread makes to another worker (D's Prefill to P) carries it on (grpc_client.py). The span
ends with the RPC, its status the gRPC code the caller got.
"""

from __future__ import annotations

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from pdorch.tracing.propagation import context_from_grpc
from pdorch.tracing.setup import Tracing

# The RPCs that serve one request, and their span names. Info, Stats, WatchKV, Traces are not traced.
TRACED_RPCS = {"/pdorch.v1.DecodeService/Generate": "decode.generate",
               "/pdorch.v1.PrefillService/Prefill": "prefill.prefill"}


def current_trace_ctx() -> otel_context.Context | None:
    """The handler thread's current context if it holds a span (the RPC's); else None."""
    ctx = otel_context.get_current()
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


class RpcSpans(grpc.ServerInterceptor):
    def __init__(self, tracing: Tracing):
        self._tracing = tracing

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        name = TRACED_RPCS.get(handler_call_details.method)
        if handler is None or name is None or handler.request_streaming:
            return handler
        parent = context_from_grpc(handler_call_details.invocation_metadata)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(
                self._streaming(name, parent, handler.unary_stream), handler.request_deserializer,
                handler.response_serializer)
        return grpc.unary_unary_rpc_method_handler(
            self._unary(name, parent, handler.unary_unary), handler.request_deserializer,
            handler.response_serializer)

    def _unary(self, name, parent, behavior):
        def traced(request, context):
            span = self._tracing.tracer.start_span(name, context=parent, kind=SpanKind.SERVER)
            token = otel_context.attach(trace.set_span_in_context(span))
            try:
                return behavior(request, context)
            finally:
                otel_context.detach(token)
                _end(span, context)
        return traced

    def _streaming(self, name, parent, behavior):
        def traced(request, context):
            span = self._tracing.tracer.start_span(name, context=parent, kind=SpanKind.SERVER)
            # NOTE: attached around each step of the handler's generator, not across the yields: grpc
            # resumes the generator on its thread, and a context left attached would leak into the next
            # RPC that thread serves.
            ctx = trace.set_span_in_context(span)
            responses = None
            try:
                token = otel_context.attach(ctx)
                try:
                    responses = behavior(request, context)
                finally:
                    otel_context.detach(token)
                while True:
                    token = otel_context.attach(ctx)
                    try:
                        item = next(responses)
                    except StopIteration:
                        return
                    finally:
                        otel_context.detach(token)
                    yield item
            finally:
                if responses is not None and hasattr(responses, "close"):
                    responses.close()
                _end(span, context)
        return traced


def _end(span: trace.Span, context) -> None:
    code = context.code() if hasattr(context, "code") else None
    if code is not None and code != grpc.StatusCode.OK:
        details = context.details() if hasattr(context, "details") else ""
        if isinstance(details, bytes):  # grpc keeps what abort() was given, encoded
            details = details.decode("utf-8", "replace")
        span.set_status(Status(StatusCode.ERROR, f"{code.name}: {details or ''}".rstrip(": ")))
        span.set_attribute("rpc.grpc.status_code", code.value[0])
    span.end()
