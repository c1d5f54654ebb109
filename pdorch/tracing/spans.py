"""Spans across thread hand-offs: a worker's request moves from a gRPC thread to the scheduler thread to
an I/O thread, so its spans are rarely "the current span" of the thread that ends them. They are
started and ended with explicit parents (the request's `trace_ctx`) and explicit times.

    span = start_span(tracing, "decode.queue", request.trace_ctx, {REQUEST_ID: rid})   # on the grpc thread
    ...
    span.end()                                                                          # on the scheduler

    record_span(tracing, "prefill.store_read", task.trace_ctx, start_ns, end_ns,       # after the fact,
                {PAGES + ".store": n, BYTES: b})                                        # on the I/O thread

Both return/do nothing costly when tracing is off (a no-op span; no attributes are built if the
caller tests `tracing.enabled` first).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Status, StatusCode

from pdorch.tracing.setup import Tracing

AttributeValue = str | bool | int | float | Sequence[str] | Sequence[int] | Sequence[float]


def start_span(tracing: Tracing, name: str, parent: Context | None, attributes: Mapping[str, AttributeValue]
               | None = None, start_ns: int | None = None, links: Sequence[Link] = ()) -> trace.Span:
    """A span started now (or at start_ns, unix ns) under `parent` (None: a new trace); end it with
    `span.end()` or `span.end(end_time=ns)` on any thread."""
    return tracing.tracer.start_span(name, context=parent, attributes=attributes, links=links,
                                     start_time=start_ns)


def record_span(tracing: Tracing, name: str, parent: Context | None, start_ns: int, end_ns: int,
                attributes: Mapping[str, AttributeValue] | None = None, error: str = "",
                links: Sequence[Link] = ()) -> None:
    """A finished interval as one span (its start and end measured by the caller); `error` sets it ERROR."""
    if not tracing.enabled:
        return
    span = tracing.tracer.start_span(name, context=parent, attributes=attributes, links=links, start_time=start_ns)
    if error:
        span.set_status(Status(StatusCode.ERROR, error))
    span.end(end_time=end_ns)


def context_of(span: trace.Span) -> Context:
    """The context whose current span is `span`: the parent to give its child spans (and gRPC metadata)."""
    return trace.set_span_in_context(span)


def link_to(ctx: Context | None) -> tuple[Link, ...]:
    """A link to ctx's span (a write-back's span linked to the request whose pages it writes); () if none."""
    if ctx is None:
        return ()
    sc = trace.get_current_span(ctx).get_span_context()
    return (Link(sc),) if sc.is_valid else ()


def now_ns() -> int:
    """Unix time in ns, the clock spans use (time.monotonic() is not comparable across processes)."""
    return time.time_ns()
