"""The router's lock-free metrics export exactly what prometheus_client's own metrics would."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from router.metrics import RouterMetrics


def _samples(text: bytes, prefix: str) -> dict:
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            if s.name.startswith(prefix) and not s.name.endswith("_created"):
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_histogram_and_counters_match_prometheus_client():
    ours = RouterMetrics()
    ref = CollectorRegistry()
    ttft = Histogram("pdorch_router_ttft_seconds", "t", ["route"], registry=ref,
                     buckets=ours.ttft.buckets)
    requests = Counter("pdorch_router_requests", "r", ["route", "status"], registry=ref)
    for route in ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/generate"):  # ours are pre-created at 0
        ttft.labels(route)
        for status in ("200", "500", "502", "503", "504"):
            requests.labels(route, status)
    # on a bucket bound, between bounds, below the first, above the last
    for value in (0.005, 0.0051, 0.001, 0.25, 301.0, 0.0):
        ours.ttft.labels("/generate").observe(value)
        ttft.labels("/generate").observe(value)
    ours.requests.labels("/generate", 200).inc()  # an int status and its str spelling are one child
    ours.requests.labels("/generate", "200").inc()
    requests.labels("/generate", "200").inc(2)
    ours.requests.labels("/v1/completions", 429).inc()
    requests.labels("/v1/completions", "429").inc()
    for prefix in ("pdorch_router_ttft_seconds", "pdorch_router_requests_total"):
        assert _samples(ours.render(), prefix) == _samples(generate_latest(ref), prefix)


def test_unlabelled_counters_export_zero_and_gauges_read_at_scrape():
    m = RouterMetrics()
    in_flight = [3]
    m.in_flight = lambda: in_flight[0]
    m.workers_healthy = lambda: {"prefill": 2, "decode": 1}
    got = _samples(m.render(), "pdorch_router_")
    assert got[("pdorch_router_retries_total", ())] == 0.0
    assert got[("pdorch_router_prompt_tokens_total", ())] == 0.0
    assert got[("pdorch_router_requests_in_flight", ())] == 3.0
    assert got[("pdorch_router_workers_healthy", (("role", "decode"),))] == 1.0
    m.retries.inc()
    in_flight[0] = 0
    got = _samples(m.render(), "pdorch_router_")
    assert got[("pdorch_router_retries_total", ())] == 1.0
    assert got[("pdorch_router_requests_in_flight", ())] == 0.0


def test_wrong_label_count_is_refused():
    with pytest.raises(ValueError, match=r"route.*status"):
        RouterMetrics().requests.labels("/generate")


def test_labelled_series_exist_at_zero_before_their_first_event():
    """`rate()` counts a series' first increase only if the series existed before it."""
    m = RouterMetrics()
    got = _samples(m.render(), "pdorch_router_")
    for route in ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/generate"):
        for status in ("500", "502", "503", "504", "200"):
            assert got[("pdorch_router_requests_total", (("route", route), ("status", status)))] == 0.0
        assert got[("pdorch_router_ttft_seconds_count", (("route", route),))] == 0.0
    for outcome in ("resumed", "failed"):
        assert got[("pdorch_router_failovers_total", (("outcome", outcome),))] == 0.0
    for tier in ("device", "host", "store"):
        assert got[("pdorch_router_cached_tokens_total", (("tier", tier),))] == 0.0
    m.routed_to("decode", "10.0.0.5:50171")  # a worker's error series exists once it is routed to
    got = _samples(m.render(), "pdorch_router_")
    assert got[("pdorch_router_worker_errors_total", (("role", "decode"), ("worker", "10.0.0.5:50171")))] == 0.0
    assert got[("pdorch_router_worker_requests_total", (("role", "decode"), ("worker", "10.0.0.5:50171")))] == 1.0
