"""The last N traces a process keeps in memory (observability.keep_traces), for `pdorch trace` and the
router's /admin/traces, with no collector.

A span processor: `on_end` runs on the thread that ends the span and only appends to a dict under a
lock (no encoding, no I/O). Bounded twice: at most `keep_traces` traces (the oldest first trace goes)
and `max_spans_per_trace` spans of each. Spans become `SpanRecord`s only when asked for.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from pdorch.tracing.names import REQUEST_ID


class TraceRing(SpanProcessor):
    def __init__(self, keep_traces: int, max_spans_per_trace: int):
        self._keep, self._max_spans = keep_traces, max_spans_per_trace
        self._lock = threading.Lock()
        self._traces: OrderedDict[int, list[ReadableSpan]] = OrderedDict()  # trace id -> spans, oldest first
        self._by_request: dict[str, int] = {}  # pdorch.request_id -> trace id, for the traces kept

    # ------------------------------------------------------------------ SpanProcessor
    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        sc = span.context
        if sc is None or not sc.trace_flags.sampled:
            return
        request_id = (span.attributes or {}).get(REQUEST_ID)
        with self._lock:
            spans = self._traces.get(sc.trace_id)
            if spans is None:
                spans = self._traces[sc.trace_id] = []
                while len(self._traces) > self._keep:
                    self._forget(next(iter(self._traces)))
            if len(spans) < self._max_spans:
                spans.append(span)
            if isinstance(request_id, str) and request_id:
                self._by_request[request_id] = sc.trace_id

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    # ------------------------------------------------------------------ queries
    def spans(self, trace_id: int) -> list[ReadableSpan]:
        """Every span kept of one trace, ordered by start."""
        with self._lock:
            spans = list(self._traces.get(trace_id, ()))
        return sorted(spans, key=lambda s: s.start_time or 0)

    def trace_of_request(self, request_id: str) -> int | None:
        with self._lock:
            return self._by_request.get(request_id)

    def slowest(self, n: int) -> list[int]:
        """The n trace ids whose kept spans cover the longest time, longest first."""
        with self._lock:
            extents = [(max(s.end_time or 0 for s in spans) - min(s.start_time or 0 for s in spans), trace_id)
                       for trace_id, spans in self._traces.items() if spans]
        return [trace_id for _, trace_id in sorted(extents, reverse=True)[:n]]

    def _forget(self, trace_id: int) -> None:
        for span in self._traces.pop(trace_id):
            request_id = (span.attributes or {}).get(REQUEST_ID)
            if isinstance(request_id, str) and self._by_request.get(request_id) == trace_id:
                del self._by_request[request_id]
