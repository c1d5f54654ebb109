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
    # on a bucket bound, between bounds, below the first, above the last
    for value in (0.005, 0.0051, 0.001, 0.25, 301.0, 0.0):
        ours.ttft.labels("/generate").observe(value)
        ttft.labels("/generate").observe(value)
    ours.requests.labels("/generate", 200).inc()  # an int status and its str spelling are one child
    ours.requests.labels("/generate", "200").inc()
    requests.labels("/generate", "200").inc(2)
    ours.requests.labels("/v1/completions", 429).inc()
    requests.labels("/v1/completions", "429").inc()
    for prefix in ("pdorch_router_ttft_seconds", "pdorch_router_requests"):
        assert _samples(ours.render(), prefix) == _samples(generate_latest(ref), prefix)


def test_unlabelled_counters_export_zero_and_gauges_read_at_scrape():
    m = RouterMetrics()
    in_flight = [3]
    m.queue_depth = lambda: in_flight[0]
    m.workers_healthy = lambda: {"prefill": 2, "decode": 1}
    got = _samples(m.render(), "pdorch_router_")
    assert got[("pdorch_router_retries_total", ())] == 0.0
    assert got[("pdorch_router_prompt_tokens_total", ())] == 0.0
    assert got[("pdorch_router_queue_depth", ())] == 3.0
    assert got[("pdorch_router_workers_healthy", (("role", "decode"),))] == 1.0
    m.retries.inc()
    in_flight[0] = 0
    got = _samples(m.render(), "pdorch_router_")
    assert got[("pdorch_router_retries_total", ())] == 1.0
    assert got[("pdorch_router_queue_depth", ())] == 0.0


def test_wrong_label_count_is_refused():
    with pytest.raises(ValueError, match=r"route.*status"):
        RouterMetrics().requests.labels("/generate")
