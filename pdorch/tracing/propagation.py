"""W3C trace context (`traceparent` / `tracestate`) in and out of HTTP headers and gRPC metadata.

A malformed or absent `traceparent` yields None: the caller starts a new trace, never an error (the
W3C spec's rule, and the issue's bad-input rule). No global propagator is used: each call names its carrier.
"""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"

_W3C = TraceContextTextMapPropagator()


def context_from_headers(traceparent: str | None, tracestate: str | None = None) -> Context | None:
    """The remote parent a client's headers name; None when there is none or it is malformed."""
    if not traceparent:
        return None
    carrier = {TRACEPARENT: traceparent}
    if tracestate:
        carrier[TRACESTATE] = tracestate
    return _valid(_W3C.extract(carrier))


def context_from_grpc(invocation_metadata: Iterable[tuple[str, str | bytes]] | None) -> Context | None:
    """The caller's span context from a gRPC call's metadata (`context.invocation_metadata()`); None
    when the caller sent none (tracing off there, or an older caller) or a malformed one."""
    carrier = {}
    for key, value in invocation_metadata or ():
        if key in (TRACEPARENT, TRACESTATE):
            carrier[key] = value.decode("latin-1") if isinstance(value, bytes) else value
    return _valid(_W3C.extract(carrier)) if carrier else None


def grpc_metadata(ctx: Context | None) -> tuple[tuple[str, str], ...]:
    """`traceparent` (and `tracestate`) metadata carrying `ctx`'s current span to a callee; () when
    ctx holds no valid span (tracing off: nothing is added to the call)."""
    if ctx is None or not trace.get_current_span(ctx).get_span_context().is_valid:
        return ()
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, context=ctx)
    return tuple(carrier.items())


def traceparent_of(span: trace.Span) -> str:
    """The `traceparent` header value naming `span` (returned to the client); "" for an invalid span."""
    sc = span.get_span_context()
    if not sc.is_valid:
        return ""
    return f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{int(sc.trace_flags):02x}"


def _valid(ctx: Context) -> Context | None:
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None
