"""One process's tracing: `setup_tracing(cfg, service_name, instance) -> Tracing`.

Off (no otlp_endpoint, keep_traces 0) it is `Tracing.enabled == False` with OpenTelemetry's no-op
tracer: callers test `enabled` before building attributes, so a request pays one attribute read.
On, a TracerProvider of its own (never the global one: tests run several processes' worth in one
interpreter) with a parent-based ratio sampler, the OTLP batch processor (its own thread; a full
queue drops spans, it never blocks a request) and the in-memory ring.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from pdorch.config import ObservabilityConfig
from pdorch.tracing.records import span_record
from pdorch.tracing.ring import TraceRing
from proto.pdorch.v1 import worker_pb2 as pb

log = logging.getLogger(__name__)


@dataclass(eq=False)  # one per process, compared by identity (and so a valid default of frozen configs)
class Tracing:
    """The tracer a process's code starts spans with, and what it keeps of them."""

    enabled: bool
    tracer: trace.Tracer
    service: str = ""
    ring: TraceRing | None = None
    provider: TracerProvider | None = None
    shutdown_timeout_s: float = 2.0
    # what deferred spans (deferred.py) need of the provider: the sampler's bound, the processors, the resource
    sample_bound: int = 0  # a new trace is sampled when its id's low 64 bits are under this
    processors: tuple[SpanProcessor, ...] = ()
    resource: Resource | None = None
    scope: InstrumentationScope | None = None
    _closed: bool = field(default=False, repr=False)

    def records(self, trace_id: str = "", request_id: str = "") -> list[pb.SpanRecord]:
        """What the Traces RPC answers: the ring's spans of one trace (by id, else by request id)."""
        if self.ring is None:
            return []
        tid = _trace_id(trace_id) if trace_id else self.ring.trace_of_request(request_id) if request_id else None
        return [span_record(s) for s in self.ring.spans(tid)] if tid is not None else []

    def shutdown(self) -> None:
        """Export what is queued within shutdown_timeout_s, then stop; never waits longer."""
        if self.provider is None or self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + self.shutdown_timeout_s
        self.provider.force_flush(int(self.shutdown_timeout_s * 1000))
        # NOTE: the SDK's shutdown joins its export thread with a 30 s default; on a thread of ours
        # joined until our deadline, a hung collector cannot hold the process's exit.
        closer = threading.Thread(target=self.provider.shutdown, name="tracing-shutdown", daemon=True)
        closer.start()
        closer.join(max(0.0, deadline - time.monotonic()))


NO_TRACING = Tracing(enabled=False, tracer=trace.NoOpTracer())


def setup_tracing(cfg: ObservabilityConfig, service_name: str, instance: str) -> Tracing:
    """The process's Tracing from its `observability` section; NO_TRACING when it asks for nothing."""
    if not cfg.otlp_endpoint and cfg.keep_traces == 0:
        return NO_TRACING
    resource = Resource.create({"service.name": service_name, "service.instance.id": instance})
    ratio = TraceIdRatioBased(cfg.sample_ratio)
    provider = TracerProvider(resource=resource, sampler=ParentBased(ratio))
    processors: list[SpanProcessor] = []
    ring = None
    if cfg.keep_traces:
        ring = TraceRing(cfg.keep_traces, cfg.max_spans_per_trace)
        processors.append(ring)
    if cfg.otlp_endpoint:
        processors.append(BatchSpanProcessor(
            _exporter(cfg), max_queue_size=cfg.export_queue_size, schedule_delay_millis=cfg.export_delay_ms,
            max_export_batch_size=min(512, cfg.export_queue_size)))
    for processor in processors:
        provider.add_span_processor(processor)
        log.info("tracing: exporting spans of %s over OTLP/%s to %s (sample ratio %s)", service_name,
                 cfg.otlp_protocol, cfg.otlp_endpoint, cfg.sample_ratio)
    return Tracing(enabled=True, tracer=provider.get_tracer("pdorch"), service=service_name, ring=ring,
                   provider=provider, shutdown_timeout_s=cfg.shutdown_timeout_s, sample_bound=ratio.bound,
                   processors=tuple(processors), resource=resource, scope=InstrumentationScope("pdorch"))


def _exporter(cfg: ObservabilityConfig):
    # Imported here: a process that does not export never loads the exporters (grpc's or requests').
    if cfg.otlp_protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        # An http:// endpoint is plaintext, https:// TLS (the exporter reads the scheme).
        return OTLPSpanExporter(endpoint=cfg.otlp_endpoint, timeout=10)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter(endpoint=cfg.otlp_endpoint, timeout=10)


def _trace_id(text: str) -> int | None:
    try:
        value = int(text, 16)
    except ValueError:
        return None
    return value if len(text) == 32 and value else None
