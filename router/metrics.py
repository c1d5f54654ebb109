"""Prometheus metrics of the router, on a registry owned by one app instance.

The hot path (every request and every streamed chunk) updates plain Python numbers: the router
runs on one event loop thread, so its metrics need no lock, and prometheus_client's own
metrics cost 1-3 us per update (a lock, label checks, a linear bucket search) about a dozen
times per request. `LoopCounter` / `LoopHistogram` keep the numbers; a collector turns them
into the usual samples when /metrics is scraped (same names, `_total` / `_bucket` / `_sum` /
`_count`). Update them only from the router's event loop.

NOTE: a private CollectorRegistry (not the process-global one) lets tests run several routers
in one process without duplicate-metric errors.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric

from pdorch.worker.prefill_rpc import (
    CACHE_TIERS,  # device, host, store, ssd: one definition for P, D and router
)

# Labelled series exported at 0 from the start: `rate()` sees a counter's first increase only when
# the series existed before it (the first 5xx or failed failover of a pod would count for nothing).
GENERATION_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/generate")
PRECREATED_STATUSES = ("200", "500", "502", "503", "504")
FAILOVER_OUTCOMES = ("resumed", "failed")

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)


class _CounterChild:
    __slots__ = ("value",)

    def __init__(self):
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class _HistogramChild:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        self.counts[bisect_left(self.bounds, amount)] += 1  # bucket i counts values <= bounds[i]
        self.sum += amount


Child = TypeVar("Child")  # a family's child: _CounterChild, _HistogramChild


class _Family(Generic[Child]):
    """A labelled metric: `labels(*values)` returns the (cached) child; an unlabelled one is
    used directly (`inc` / `observe` go to its only child)."""

    def __init__(self, name: str, doc: str, labelnames: tuple[str, ...], new_child: Callable[[], Child]):
        self.name, self.doc, self.labelnames = name, doc, labelnames
        self._new_child = new_child
        self.children: dict[tuple[str, ...], Child] = {}
        # an unlabelled family's only child, exported as 0 from the start like prometheus_client's own
        # (its inc / observe go straight to it); None for a labelled family
        self._only = self.labels() if not labelnames else None

    def labels(self, *values) -> Child:
        child = self.children.get(values)
        if child is None:  # a new child, or values that are not all str (an int HTTP status)
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values!r}")
            key = tuple(str(v) for v in values)
            child = self.children.get(key)
            if child is None:
                child = self.children[key] = self._new_child()
        return child

    def collect(self) -> Metric:
        raise NotImplementedError


class LoopCounter(_Family[_CounterChild]):
    def __init__(self, name: str, doc: str, labelnames: tuple[str, ...] = ()):
        super().__init__(name, doc, labelnames, _CounterChild)

    def inc(self, amount: float = 1.0) -> None:
        (self._only or self.labels()).inc(amount)  # labelled: labels() names the missing labels

    def collect(self):
        family = CounterMetricFamily(self.name, self.doc, labels=self.labelnames)
        for values, child in self.children.items():
            family.add_metric(values, child.value)
        return family


class LoopHistogram(_Family[_HistogramChild]):
    def __init__(self, name: str, doc: str, buckets: tuple[float, ...], labelnames: tuple[str, ...] = ()):
        super().__init__(name, doc, labelnames, lambda: _HistogramChild(buckets))
        self.buckets = buckets

    def observe(self, amount: float) -> None:
        (self._only or self.labels()).observe(amount)

    def collect(self):
        family = HistogramMetricFamily(self.name, self.doc, labels=self.labelnames)
        for values, child in self.children.items():
            cumulative, total = [], 0
            for bound, n in zip((*map(float, self.buckets), float("inf")), child.counts):
                total += n
                cumulative.append(("+Inf" if bound == float("inf") else repr(bound), total))
            family.add_metric(values, cumulative, child.sum)
        return family


class RouterMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self):
        self.requests = LoopCounter("pdorch_router_requests", "HTTP requests by route and status",
                                    ("route", "status"))
        self.ttft = LoopHistogram("pdorch_router_ttft_seconds", "Time to first token", _LATENCY_BUCKETS, ("route",))
        self.itl = LoopHistogram("pdorch_router_inter_token_latency_seconds", "Time between streamed chunks",
                                 _ITL_BUCKETS)
        self.e2e = LoopHistogram("pdorch_router_e2e_seconds", "Request latency, first byte in to last byte out",
                                 _LATENCY_BUCKETS, ("route",))
        self.prompt_tokens = LoopCounter("pdorch_router_prompt_tokens", "Prompt tokens routed")
        self.cached_tokens = LoopCounter("pdorch_router_cached_tokens", "Prompt tokens reused, by tier", ("tier",))
        self.completion_tokens = LoopCounter("pdorch_router_completion_tokens", "Generated tokens")
        self.preemptions = LoopCounter("pdorch_router_preemptions", "Preemptions the streams went through on "
                                       "their decode workers (each paused the stream; none cut it)")
        self.worker_routed = LoopCounter("pdorch_router_worker_requests", "Requests routed to a worker",
                                         ("role", "worker"))
        self.worker_errors = LoopCounter("pdorch_router_worker_errors", "Failed requests per worker",
                                         ("role", "worker"))
        self.retries = LoopCounter("pdorch_router_retries", "Requests retried on another P/D pair")
        self.failovers = LoopCounter("pdorch_router_failovers", "Streams whose decode worker died mid-stream, by "
                                     "outcome (resumed on another decode worker, or failed)", ("outcome",))
        self.failover_gap = LoopHistogram("pdorch_router_failover_gap_seconds", "From a decode worker's broken "
                                          "stream to the resumed stream's first token", _LATENCY_BUCKETS)
        self.failover_cached_tokens = LoopCounter("pdorch_router_failover_cached_tokens", "Resumed streams: "
                                                  "prompt + streamed tokens reused instead of computed, by tier",
                                                  ("tier",))
        self.failover_computed_tokens = LoopCounter("pdorch_router_failover_computed_tokens",
                                                    "Resumed streams: prompt + streamed tokens computed again")
        self._precreate()
        # NOTE: the hot path's labelled children, looked up once (labels() is a dict lookup, a tuple
        # and a call each time; a request updates ~a dozen).
        self.cached_tokens_by_tier = [(tier, self.cached_tokens.labels(tier)) for tier in CACHE_TIERS]
        self._routed: dict[tuple[str, str], _CounterChild] = {}
        self._answered: dict[tuple[str, int], _CounterChild] = {}
        self._families: list[LoopCounter | LoopHistogram] = [self.requests, self.ttft, self.itl, self.e2e, self.prompt_tokens, self.cached_tokens,
                          self.completion_tokens, self.preemptions, self.worker_routed, self.worker_errors, self.retries,
                          self.failovers, self.failover_gap, self.failover_cached_tokens,
                          self.failover_computed_tokens]
        # Gauges are read when scraped: nothing to update on the hot path.
        self.in_flight: Callable[[], float] = lambda: 0.0
        self.workers_healthy: Callable[[], dict[str, int]] = dict
        self.prefill_choices: Callable[[], dict[str, int]] = dict  # the policy's choices by reason
        self.decode_choices: Callable[[], dict[str, int]] = dict
        self.guess_fallbacks: Callable[[], int] = lambda: 0
        self.extra: list[Callable[[], Iterable]] = []  # more families read at scrape time (KV events, index)
        self.registry = CollectorRegistry()
        self.registry.register(self)

    def _precreate(self) -> None:
        for route in GENERATION_ROUTES:
            for status in PRECREATED_STATUSES:
                self.requests.labels(route, status)
            self.ttft.labels(route)
            self.e2e.labels(route)
        for tier in CACHE_TIERS:
            self.cached_tokens.labels(tier)
            self.failover_cached_tokens.labels(tier)
        for outcome in FAILOVER_OUTCOMES:
            self.failovers.labels(outcome)

    def answered(self, route: str, status: int) -> None:
        """A request to `route` was answered `status` (requests{route, status}; the status an int, as the
        protocol has it: the child is kept under it, no str() per request)."""
        child = self._answered.get((route, status))
        if child is None:
            child = self._answered[(route, status)] = self.requests.labels(route, status)
        child.inc()

    def routed_to(self, role: str, worker: str) -> None:
        """A request went to `worker`: counted, and its error series exists (at 0) from now on."""
        child = self._routed.get((role, worker))
        if child is None:
            child = self._routed[(role, worker)] = self.worker_routed.labels(role, worker)
            self.worker_errors.labels(role, worker)
        child.inc()

    def collect(self):
        """The registry's view (prometheus_client collector protocol)."""
        for family in self._families:
            yield family.collect()
        # NOTE: requests in flight, not a queue (the router queues nothing: past
        # router.max_queued_requests it answers 429); the queues are the workers' queue_depth.
        yield GaugeMetricFamily("pdorch_router_requests_in_flight", "Requests in flight in the router",
                                value=self.in_flight())
        healthy = GaugeMetricFamily("pdorch_router_workers_healthy", "Healthy workers", labels=("role",))
        for role, n in self.workers_healthy().items():
            healthy.add_metric((role,), n)
        yield healthy
        choices = CounterMetricFamily("pdorch_router_prefill_choices", "Prefill worker choices of the policy, by "
                                      "reason (prefix_match, store_covered, imbalance, no_match, no_prefix)",
                                      labels=("reason",))
        for reason, n in self.prefill_choices().items():
            choices.add_metric((reason,), n)
        yield choices
        decode = CounterMetricFamily("pdorch_router_decode_choices", "Decode worker choices on KV events, by "
                                     "reason (without events, or with a stale stream, decode is least load)",
                                     labels=("reason",))
        for reason, n in self.decode_choices().items():
            decode.add_metric((reason,), n)
        yield decode
        yield CounterMetricFamily("pdorch_router_kv_guess_fallbacks", "Prefill choices made on the routing-time "
                                  "guess because a candidate's KV event stream was not live (router.kv_events)",
                                  value=self.guess_fallbacks())
        for families in self.extra:
            yield from families()

    def render(self) -> bytes:
        return generate_latest(self.registry)
