"""Spans kept as plain records while their request runs, handed to the span processors (the ring, the
OTLP batch export) as finished ReadableSpans once the response is out: the router's hot path, where
the SDK's span start (~10 µs each: sampler, id generator, a lock, attribute checks) would sit on the
event loop before the first token.

    trace_id, span_id, sampled = new_ids(tracing, parent)       # one draw, one compare
    span = DeferredSpan("router.request", SpanKind.SERVER, trace_id, span_id, parent, now_ns())
    ...                                                          # attributes in a dict, events in a list
    span.end_ns = now_ns()
    emit(tracing, [span, ...], trace_state)                     # after the response, only if sampled

Sampling is the SDK's ParentBased(TraceIdRatioBased(sample_ratio)), done here: a client's parent
decides by its sampled flag; a new trace is sampled when its id's low 64 bits are under ratio * 2^64.
An unsampled request gets ids and nothing else (its traceparent still names them, flags 00, so the
workers follow the decision), and no span object at all.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from pdorch.tracing.setup import Tracing

_LOW_64 = (1 << 64) - 1
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_OK = Status(StatusCode.UNSET)
_rand = random.getrandbits  # ids need to be unique, not secret (the SDK's RandomIdGenerator does the same)


def new_ids(tracing: Tracing, parent: SpanContext | None) -> tuple[int, int, bool]:
    """(trace id, span id, sampled) of a span under `parent` (None: a new trace)."""
    if parent is not None:
        return parent.trace_id, new_span_id(), parent.trace_flags.sampled
    trace_id = _rand(128) or 1
    return trace_id, new_span_id(), (trace_id & _LOW_64) < tracing.sample_bound


def new_span_id() -> int:
    return _rand(64) or 1  # 0 is W3C's invalid id


class DeferredSpan:
    """One span's data until it is emitted; `error` non-empty sets it ERROR with that message."""

    __slots__ = ("attributes", "end_ns", "error", "events", "kind", "name", "parent", "span_id", "start_ns")

    def __init__(self, name: str, kind: SpanKind, span_id: int, parent: SpanContext | None, start_ns: int):
        self.name, self.kind, self.span_id, self.parent, self.start_ns = name, kind, span_id, parent, start_ns
        self.end_ns = 0
        self.attributes: dict = {}
        self.events: list[tuple[str, dict, int]] = []  # (name, attributes, unix ns)
        self.error = ""


def emit(tracing: Tracing, trace_id: int, spans: Iterable[DeferredSpan], trace_state: TraceState | None) -> None:
    """The finished spans of one sampled trace, to every span processor (as the SDK's span.end() does)."""
    for span in spans:
        readable = ReadableSpan(
            span.name, SpanContext(trace_id, span.span_id, False, _SAMPLED, trace_state), span.parent,
            tracing.resource, span.attributes, [Event(name, attrs, ts) for name, attrs, ts in span.events], (),
            span.kind, None, Status(StatusCode.ERROR, span.error) if span.error else _OK, span.start_ns,
            span.end_ns, tracing.scope)
        for processor in tracing.processors:
            processor.on_end(readable)


def child_context(trace_id: int, span_id: int, sampled: bool, trace_state: TraceState | None) -> SpanContext:
    """The context naming one of these spans, as a child's parent."""
    return SpanContext(trace_id, span_id, False, _SAMPLED if sampled else TraceFlags(0), trace_state)
