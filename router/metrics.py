"""Prometheus metrics of the router, on a registry owned by one app instance.

NOTE: a private CollectorRegistry (not the process-global one) lets tests run several routers
in one process without duplicate-metric errors.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)


class RouterMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self):
        r = self.registry = CollectorRegistry()
        self._children: dict = {}
        self.requests = Counter("pdorch_router_requests", "HTTP requests by route and status",
                                ["route", "status"], registry=r)
        self.ttft = Histogram("pdorch_router_ttft_seconds", "Time to first token", ["route"],
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("pdorch_router_inter_token_latency_seconds", "Time between streamed chunks",
                             buckets=_ITL_BUCKETS, registry=r)
        self.e2e = Histogram("pdorch_router_e2e_seconds", "Request latency, first byte in to last byte out",
                             ["route"], buckets=_LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("pdorch_router_prompt_tokens", "Prompt tokens routed", registry=r)
        self.cached_tokens = Counter("pdorch_router_cached_tokens", "Prompt tokens reused, by tier",
                                     ["tier"], registry=r)
        self.completion_tokens = Counter("pdorch_router_completion_tokens", "Generated tokens", registry=r)
        self.worker_routed = Counter("pdorch_router_worker_requests", "Requests routed to a worker",
                                     ["role", "worker"], registry=r)
        self.worker_errors = Counter("pdorch_router_worker_errors", "Failed requests per worker",
                                     ["role", "worker"], registry=r)
        self.retries = Counter("pdorch_router_retries", "Requests retried on another P/D pair", registry=r)
        self.queue_depth = Gauge("pdorch_router_queue_depth", "Requests in flight in the router", registry=r)
        self.workers_healthy = Gauge("pdorch_router_workers_healthy", "Healthy workers", ["role"], registry=r)

    # NOTE: `.labels(...)` takes a lock and builds a key on every call; the hot path asks for the
    # same few children thousands of times a second, so it keeps them here.
    def child(self, metric, *labels):
        key = (id(metric), labels)
        c = self._children.get(key)
        if c is None:
            c = self._children[key] = metric.labels(*labels)
        return c

    def render(self) -> bytes:
        return generate_latest(self.registry)
