"""The router's spans of one request (observability.*; docs/operations.md, "Reading a trace").

    router.request   (server span) the whole HTTP request, from its headers to the response's last byte:
                     model, route, request id, the chosen P and D, retries, failovers, preemptions, cached
                     tokens by tier, finish reason, the HTTP status; ERROR with the code the client saw
      router.attempt (client span) one Generate call on a P/D pair: the policy's decision and its
                     candidates, P, D, whether it resumes a broken stream; ERROR when the call failed.
                     Its context goes to D as `traceparent` metadata, so the workers' spans are its children.

Made by the HTTP layer (router/http/hot_path.py) only when tracing is on; the job carries it
(`Job.trace`, None when off: every hook below is behind one `is not None`).
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from pdorch.tracing import names
from pdorch.tracing.propagation import context_from_headers, traceparent_of
from pdorch.tracing.setup import Tracing
from pdorch.tracing.spans import context_of
from pdorch.worker.prefill_rpc import CACHE_TIERS


class RequestTrace:
    # NOTE: the request span's attributes are gathered in a dict and set once, at its end: the SDK
    # checks and copies every value on each set_attribute(s) call, which was most of a span's cost.
    __slots__ = ("_attempt", "_attempt_attributes", "_error", "attributes", "context", "failovers", "retries", "span", "tracing")

    def __init__(self, tracing: Tracing, traceparent: str | None, tracestate: str | None, route: str, model: str):
        self.tracing = tracing
        parent = context_from_headers(traceparent, tracestate) if traceparent else None  # malformed: a new trace
        self.span = tracing.tracer.start_span("router.request", context=parent, kind=SpanKind.SERVER)
        self.context = context_of(self.span)
        self.attributes: dict = {"http.route": route, names.MODEL: model}
        self.retries = self.failovers = 0
        self._attempt: trace.Span | None = None
        self._attempt_attributes: dict = {}
        self._error = False

    def traceparent(self) -> bytes:
        """The response's `traceparent` header: this request's span."""
        return traceparent_of(self.span).encode()

    def trace_id(self) -> str:
        return f"{self.span.get_span_context().trace_id:032x}"

    # ------------------------------------------------------------------ dispatch (router/dispatch/dispatch.py)
    def request(self, request_id: str, prompt_tokens: int) -> None:
        self.attributes[names.REQUEST_ID] = request_id
        self.attributes[names.PROMPT_TOKENS] = prompt_tokens

    def attempt(self, p, d, policy: str, decision: str, candidates, resumed: bool) -> tuple[tuple[str, str], ...]:
        """A Generate call is about to go to D (with P): its span, and the metadata that carries it."""
        self.end_attempt()
        chosen = {names.PREFILL_WORKER: p.address, names.DECODE_WORKER: d.address, names.POLICY: policy}
        self.attributes.update(chosen)
        self._attempt = span = self.tracing.tracer.start_span("router.attempt", context=self.context,
                                                              kind=SpanKind.CLIENT)
        # NOTE: recorded when the attempt ends, after the first token: nothing but the span's start is on
        # the TTFT path (the loads are the ones the policy weighed, taken now)
        self._attempt_attributes = {**chosen, "pdorch.policy.decision": decision, "pdorch.resumed": resumed,
                                    names.POLICY_SCORES: ", ".join(f"{w.address} load={w.load}" for w in candidates)}
        return attempt_metadata(span)

    def end_attempt(self, error: str = "") -> None:
        span, self._attempt = self._attempt, None
        if span is None:
            return
        span.set_attributes(self._attempt_attributes)
        if error:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end()

    def retry(self, error: str) -> None:
        self.retries += 1
        self.span.add_event("retry", {"error": error})

    def failover(self, error: str, streamed_tokens: int) -> None:
        self.failovers += 1
        self.end_attempt(error)
        self.span.add_event("failover", {"error": error, "streamed_tokens": streamed_tokens})

    def stream_failed(self, message: str) -> None:
        """The stream broke after the client had its 200: the error event it got instead of the rest."""
        self.end_attempt(message)
        self._fail(message, "stream_failed")

    # ------------------------------------------------------------------ the end (router/dispatch/service.py, hot_path.py)
    def finished(self, choices) -> None:
        """The request's outcome, from its Progress (one per sequence)."""
        self.end_attempt()
        first = choices[0]
        attributes = self.attributes
        attributes[names.PREEMPTIONS] = sum(p.preemptions for p in choices)
        attributes[names.COMPLETION_TOKENS] = sum(len(p.output_ids) for p in choices)
        attributes[names.FINISH_REASON] = first.finish_reason or ""
        for tier, name in _CACHED:
            attributes[name] = getattr(first, tier)

    def end(self, status: int, error_code: str = "", message: str = "") -> None:
        """The response is out: `status` as the client saw it (an error's code and message with it)."""
        self.end_attempt()
        attributes = self.attributes
        attributes[names.HTTP_STATUS] = status
        attributes[names.RETRIES], attributes[names.FAILOVERS] = self.retries, self.failovers
        if status >= 400:
            self._fail(message or f"HTTP {status}", error_code or str(status))
        self.span.set_attributes(attributes)
        self.span.end()

    def _fail(self, message: str, code: str) -> None:
        if self._error:
            return
        self._error = True
        self.attributes[names.ERROR_CODE] = code
        self.span.set_status(Status(StatusCode.ERROR, message))


_CACHED = tuple((tier, f"{names.CACHED_TOKENS}.{tier}") for tier in CACHE_TIERS)


def attempt_metadata(span: trace.Span) -> tuple[tuple[str, str], ...]:
    """`traceparent` (and the client's `tracestate`) naming the attempt's span, for D's Generate call;
    written directly (the propagator's inject costs a context lookup and a carrier per call)."""
    sc = span.get_span_context()
    if not sc.is_valid:
        return ()
    state = sc.trace_state.to_header() if sc.trace_state else ""
    parent = ("traceparent", traceparent_of(span))
    return (parent, ("tracestate", state)) if state else (parent,)
