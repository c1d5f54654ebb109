"""The router's spans of one request (observability.*; docs/operations.md, "Reading a trace").

    router.request   (server span) the whole HTTP request, from its headers to the response's last byte:
                     model, route, request id, the chosen P and D, retries, failovers, preemptions, cached
                     tokens by tier, finish reason, the HTTP status; ERROR with the code the client saw
      router.attempt (client span) one Generate call on a P/D pair: the policy's decision and its
                     candidates, P, D, whether it resumes a broken stream; ERROR when the call failed.
                     Its context goes to D as `traceparent` metadata, so the workers' spans are its children.

Made by the HTTP layer (router/http/hot_path.py) only when tracing is on; the job carries it
(`Job.trace`, None when off: every hook below is behind one `is not None`).

Nothing here touches the OpenTelemetry SDK while the request runs: the spans are plain records
(pdorch/tracing/deferred.py) and become the SDK's finished spans in `end`, after the response's last
byte. An unsampled request (sample ratio 0, or a client's unsampled traceparent) is its ids only: one
draw, one compare, the `traceparent` it sends on, and every hook returns at once.
"""

from __future__ import annotations

import time

from opentelemetry import trace
from opentelemetry.trace import SpanContext, SpanKind

from pdorch.tracing import names
from pdorch.tracing.deferred import DeferredSpan, child_context, emit, new_ids, new_span_id
from pdorch.tracing.propagation import context_from_headers
from pdorch.tracing.setup import Tracing
from pdorch.worker.prefill_rpc import CACHE_TIERS


class RequestTrace:
    __slots__ = ("_attempt", "_attempts", "_header", "_metadata", "_state", "attributes", "context", "failovers",
                 "retries", "sampled", "span", "span_id", "trace_id", "tracing")

    def __init__(self, tracing: Tracing, traceparent: str | None, tracestate: str | None, route: str, model: str):
        self.tracing = tracing
        parent = _remote_parent(traceparent, tracestate) if traceparent else None  # malformed: a new trace
        self._state = parent.trace_state if parent is not None and parent.trace_state else None
        self.trace_id, self.span_id, self.sampled = new_ids(tracing, parent)
        self.context: SpanContext | None = None  # built when first asked for (a child's parent)
        flags = "01" if self.sampled else "00"
        self._header = f"00-{self.trace_id:032x}-{self.span_id:016x}-{flags}"
        self.span: DeferredSpan | None = None
        self._attempt: DeferredSpan | None = None
        self._attempts: list[tuple[DeferredSpan, list[tuple[str, int]]]] = []  # each with its policy's scores
        self.retries = self.failovers = 0
        if not self.sampled:
            self._metadata = _metadata(self._header, self._state)  # every Generate call's: the request's ids
            self.attributes: dict = {}
            return
        self._metadata = ()
        self.span = DeferredSpan("router.request", SpanKind.SERVER, self.span_id, parent, time.time_ns())
        self.attributes = self.span.attributes
        self.attributes["http.route"] = route
        self.attributes[names.MODEL] = model

    def traceparent(self) -> bytes:
        """The response's `traceparent` header: this request's span."""
        return self._header.encode()

    # ------------------------------------------------------------------ dispatch (router/dispatch/dispatch.py)
    def request(self, request_id: str, prompt_tokens: int) -> None:
        if self.span is None:
            return
        self.attributes[names.REQUEST_ID] = request_id
        self.attributes[names.PROMPT_TOKENS] = prompt_tokens

    def attempt(self, p, d, policy: str, decision: str, candidates, resumed: bool) -> tuple[tuple[str, str], ...]:
        """A Generate call is about to go to D (with P): its span, and the metadata that carries it."""
        if self.span is None:
            return self._metadata  # unsampled: D follows the decision under the request's ids
        self.end_attempt()
        chosen = {names.PREFILL_WORKER: p.address, names.DECODE_WORKER: d.address, names.POLICY: policy}
        self.attributes.update(chosen)
        if self.context is None:
            self.context = child_context(self.trace_id, self.span_id, True, self._state)
        span_id = new_span_id()
        self._attempt = span = DeferredSpan("router.attempt", SpanKind.CLIENT, span_id, self.context, time.time_ns())
        # NOTE: the loads are the ones the policy weighed, taken now; their string is built in `end`
        self._attempts.append((span, [(w.address, w.load) for w in candidates]))
        span.attributes = {**chosen, "pdorch.policy.decision": decision, "pdorch.resumed": resumed}
        return _metadata(f"00-{self.trace_id:032x}-{span_id:016x}-01", self._state)

    def end_attempt(self, error: str = "") -> None:
        span, self._attempt = self._attempt, None
        if span is None:
            return
        span.end_ns = time.time_ns()
        span.error = error

    def retry(self, error: str) -> None:
        self.retries += 1
        if self.span is not None:
            self.span.events.append(("retry", {"error": error}, time.time_ns()))

    def failover(self, error: str, streamed_tokens: int) -> None:
        self.failovers += 1
        if self.span is None:
            return
        self.end_attempt(error)
        self.span.events.append(("failover", {"error": error, "streamed_tokens": streamed_tokens}, time.time_ns()))

    def stream_failed(self, message: str) -> None:
        """The stream broke after the client had its 200: the error event it got instead of the rest."""
        if self.span is None:
            return
        self.end_attempt(message)
        self._fail(self.span, message, "stream_failed")

    # ------------------------------------------------------------------ the end (router/http/service.py, hot_path.py)
    def finished(self, choices) -> None:
        """The request's outcome, from its Progress (one per sequence)."""
        if self.span is None:
            return
        self.end_attempt()
        first = choices[0]
        attributes = self.attributes
        attributes[names.PREEMPTIONS] = sum(p.preemptions for p in choices)
        attributes[names.COMPLETION_TOKENS] = sum(len(p.output_ids) for p in choices)
        attributes[names.FINISH_REASON] = first.finish_reason or ""
        for tier, name in _CACHED:
            attributes[name] = getattr(first, tier)

    def end(self, status: int, error_code: str = "", message: str = "") -> None:
        """The response is out: `status` as the client saw it (an error's code and message with it).
        The spans go to the processors now (the ring, the OTLP batch queue), after the last byte."""
        span = self.span
        if span is None:
            return
        self.end_attempt()
        attributes = self.attributes
        attributes[names.HTTP_STATUS] = status
        attributes[names.RETRIES], attributes[names.FAILOVERS] = self.retries, self.failovers
        if status >= 400:
            self._fail(span, message or f"HTTP {status}", error_code or str(status))
        span.end_ns = time.time_ns()
        self.span = None  # emitted once
        for attempt, scores in self._attempts:
            attempt.attributes[names.POLICY_SCORES] = ", ".join(f"{address} load={load}" for address, load in scores)
        emit(self.tracing, self.trace_id, (span, *(attempt for attempt, _ in self._attempts)), self._state)

    def _fail(self, span: DeferredSpan, message: str, code: str) -> None:
        if names.ERROR_CODE in self.attributes:  # the first failure is the one the client saw
            return
        span.error = message or code
        self.attributes[names.ERROR_CODE] = code


_CACHED = tuple((tier, f"{names.CACHED_TOKENS}.{tier}") for tier in CACHE_TIERS)


def _remote_parent(traceparent: str, tracestate: str | None) -> SpanContext | None:
    """The client's span (W3C rules: malformed is None) from its headers."""
    ctx = context_from_headers(traceparent, tracestate)
    return trace.get_current_span(ctx).get_span_context() if ctx is not None else None


def _metadata(traceparent: str, state) -> tuple[tuple[str, str], ...]:
    """`traceparent` (and the client's `tracestate`) for D's Generate call."""
    header = state.to_header() if state else ""
    return (("traceparent", traceparent), ("tracestate", header)) if header else (("traceparent", traceparent),)
