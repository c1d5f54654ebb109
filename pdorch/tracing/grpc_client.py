"""A sync channel's calls carry the calling thread's current span as `traceparent` metadata (D's Prefill
to P, made on D's Generate handler thread, whose current span is the Generate RPC's: grpc_server.py)."""

from __future__ import annotations

import collections

import grpc
from opentelemetry import context as otel_context

from pdorch.tracing.propagation import grpc_metadata


class _CallDetails(collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials",
                                                           "wait_for_ready", "compression")),
                   grpc.ClientCallDetails):
    pass


class SendTraceContext(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    def _details(self, d):
        extra = grpc_metadata(otel_context.get_current())
        if not extra:
            return d
        return _CallDetails(d.method, d.timeout, [*(d.metadata or ()), *extra], d.credentials,
                            getattr(d, "wait_for_ready", None), getattr(d, "compression", None))

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)
