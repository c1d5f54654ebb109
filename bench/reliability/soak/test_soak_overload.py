"""The arithmetic of `pdorch bench soak` and `pdorch bench overload`: RSS drift after warm-up, leaked
pages against the idle baseline, and how each HTTP outcome is counted."""

from __future__ import annotations

from bench.reliability.overload import classify, gate, load_summary
from bench.reliability.soak.cli import window_edges, windows_of
from bench.reliability.soak.report import leaked_pages, rss_drift


def test_rss_drift_medians_and_excursion():
    # warm-up ends at 20 s; windows of 10 s: warm = median(100, 102, 101) = 101, end = median(110, 111) = 110.5
    series = [(0.0, {"p": 50.0}), (10.0, {"p": 90.0}), (20.0, {"p": 100.0}), (25.0, {"p": 102.0}),
              (30.0, {"p": 101.0}), (40.0, {"p": 130.0}), (50.0, {"p": 110.0}), (60.0, {"p": 111.0})]
    d = rss_drift(series, warm_s=20.0, end_s=60.0, window_s=10.0)["p"]
    assert d["warm_mb"] == 101.0 and d["end_mb"] == 110.5
    assert d["end_over_warm"] == round(110.5 / 101, 4)
    assert d["max_growth"] == round(130 / 101 - 1, 4)  # the 40 s spike, not the warm-up samples
    assert d["min_over_warm"] == round(100 / 101, 4)


def test_rss_given_back_is_not_growth():
    series = [(20.0, {"p": 100.0}), (30.0, {"p": 80.0}), (60.0, {"p": 80.0})]
    d = rss_drift(series, warm_s=20.0, end_s=60.0, window_s=5.0)["p"]
    assert d["end_over_warm"] == 0.8 and d["max_growth"] == 0.0 and d["min_over_warm"] == 0.8


def test_rss_drift_skips_a_process_without_samples_in_a_window():
    assert rss_drift([(0.0, {"p": 1.0}), (100.0, {"q": 2.0})], 20.0, 100.0, 10.0) == {}


def test_leaked_pages_against_the_idle_baseline():
    base = {"prefill-0": {"free_pages": 512}, "decode-0": {"free_pages": 1024}, "decode-1": {"error": "x"}}
    end = {"prefill-0": {"free_pages": 509}, "decode-0": {"free_pages": 1024}, "decode-1": {"free_pages": 1}}
    assert leaked_pages(base, end) == {"prefill-0": 3, "decode-0": 0, "decode-1": None}


def test_outcomes_are_counted_never_dropped():
    router = 'HTTP 429: {"error": {"message": "the router has 8 requests in flight (router.max_queued_requests)"}}'
    workers = 'HTTP 429: {"error": {"message": "workers are at capacity: decode worker overloaded"}}'
    assert classify(None) == "served" and classify(router) == "429" and classify("HTTP 503: x") == "503"
    assert classify("HTTP 504: x") == "504"
    assert classify("HTTP 500: boom") == "other" and classify("RemoteProtocolError: closed") == "other"
    assert classify("upstream error: decode worker died") == "other"  # an SSE error event after the 200
    assert gate(router) == "router" and gate(workers) == "workers"
    results = [{"outcome": "served", "latency_s": 2.0, "ttft_s": 0.5, "error": None, "late": False},
               {"outcome": "429", "latency_s": 0.01, "ttft_s": None, "error": router},
               {"outcome": "other", "latency_s": 1.0, "ttft_s": None, "error": "HTTP 500: boom"},
               {"outcome": "client_timeout", "latency_s": 75.0, "ttft_s": None, "error": None}]
    s = load_summary(results)
    assert sum(s["outcomes"].values()) == s["requests"] == 4
    assert s["outcomes"]["other"] == 1 and s["outcomes"]["client_timeout"] == 1
    assert s["rejected_by"] == {"router": 1} and s["reject_p50_s"] == 0.01 and s["e2e_p50_s"] == 2.0
    assert s["examples"] == ["HTTP 500: boom"]


def test_windows_after_the_warm_up_with_hit_over_ideal_and_evictions_by_evictor():
    assert window_edges(100.0, 0.2, 4) == [0.0, 20.0, 40.0, 60.0, 80.0, 100.0]
    def req(t, prompt, cached, ideal, error=None):
        return {"start_s": t, "prompt_tokens": prompt, "cached_tokens": cached, "ideal_tokens": ideal, "error": error}
    results = [req(5, 100, 0, 0), req(25, 100, 48, 64), req(30, 100, 64, 64), req(35, 100, 0, 64, error="HTTP 503"),
               req(55, 200, 96, 96)]
    marks = [(0.0, {"master": 0, "pdorch": 0}), (20.0, {"master": 3, "pdorch": 10}),
             (40.0, {"master": 3, "pdorch": 30}), (60.0, {"master": 4, "pdorch": None})]
    w = windows_of(results, marks)
    assert [x["warmup"] for x in w] == [True, False, False]
    assert w[0]["hit_over_ideal"] is None and w[0]["master_evicted"] == 3 and w[0]["pdorch_evicted"] == 10
    # 20-40 s: the failed request does not count; 112 cached of 128 ideal, of 200 prompt tokens
    assert (w[1]["requests"], w[1]["hit_rate"], w[1]["ideal_hit_rate"], w[1]["hit_over_ideal"]) == (2, 0.56, 0.64, 0.875)
    assert (w[1]["master_evicted"], w[1]["pdorch_evicted"]) == (0, 20)
    assert w[2]["hit_over_ideal"] == 1.0 and w[2]["pdorch_evicted"] is None  # a scrape failed: unknown, not 0
