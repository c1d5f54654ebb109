"""bench/multiturn/stats.py: ideals, percentiles, tier split and the JSON fields, on small fixed
inputs whose expected values are worked out by hand in the comments."""

from __future__ import annotations

import pytest

from bench.multiturn.stats import (
    RequestResult,
    capacity_factor,
    free_l1_usable_pages,
    ideal_cached_tokens,
    percentile,
    rss_growth_ratio,
    run_summary,
    summarize_round,
    tier_tokens,
    usable_capacity_pages,
)

PAGE = 4


def test_ideal_counts_shared_full_pages_of_the_previous_kv():
    prev_prompt = list(range(10))                # 10 tokens
    answer = [100, 101, 102]                     # 3 generated: KV exists for 10 + 3 - 1 = 12 tokens
    prompt = prev_prompt + answer + [7] * 5      # 18 tokens; shares all 13 context tokens
    # shared = min(13, 12) = 12 -> 3 full pages = 12; last prompt token's page starts at 16
    assert ideal_cached_tokens(prompt, prev_prompt + answer, 12, PAGE) == 12


def test_ideal_stops_at_the_first_differing_token():
    prev = list(range(13))
    prompt = list(range(6)) + [99] * 10          # differs at index 6 -> shared 6 -> 1 page = 4
    assert ideal_cached_tokens(prompt, prev, 12, PAGE) == 4


def test_ideal_never_counts_the_page_with_the_last_prompt_token():
    prev = list(range(20))
    prompt = list(range(16))                     # all 16 shared, but token 15 sits in page [12, 16)
    # (16 - 1) // 4 * 4 = 12: the last page is recomputed for its logits
    assert ideal_cached_tokens(prompt, prev, 19, PAGE) == 12
    assert ideal_cached_tokens(list(range(17)), prev, 19, PAGE) == 16  # token 16 opens a new page


def test_ideal_is_zero_without_a_previous_request():
    assert ideal_cached_tokens(list(range(40)), [], 0, PAGE) == 0


def test_usable_capacity_and_capacity_factor():
    # 1000 bytes x 0.9 = 900 bytes = 9 pages of 100 bytes, plus 3 L1 pages = 12
    assert usable_capacity_pages(1000, 0.9, 100, 3) == 12
    assert usable_capacity_pages(0, 0.9, 100, 5) == 5            # store off: L1 only
    assert capacity_factor(12, 24) == 0.5
    assert capacity_factor(12, 6) == 1.0                          # never above 1
    assert capacity_factor(12, 0) == 1.0                          # round 0: nothing to keep yet


def test_percentile_interpolates_between_closest_ranks():
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 50) == pytest.approx(2.5)   # rank 1.5: between 2 and 3
    assert percentile(values, 90) == pytest.approx(3.7)   # rank 2.7: 3 + 0.7 x (4 - 3)
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 4.0
    assert percentile([5.0], 90) == 5.0
    assert percentile([], 50) is None


def _req(prompt, cached, ideal, pages, tiers=None, ttft=1.0, itl=(), out=4, error=None):
    return RequestResult(client=0, round=1, prompt_tokens=prompt, ideal_tokens=ideal, previous_context_pages=pages,
                         cached_tokens=cached, tiers=tiers, output_tokens=out, ttft_s=ttft, itl_s=list(itl),
                         error=error)


def test_tier_split_from_responses_metrics_or_unknown():
    a = _req(100, 60, 64, 20, tiers={"device": 40, "host": 0, "store": 12, "ssd": 8})
    b = _req(50, 16, 32, 10, tiers={"device": 0, "host": 0, "store": 16})  # a worker without the ssd tier
    # computed = 150 prompt - (40 + 0 + 28 + 8) cached = 74
    assert tier_tokens([a, b]) == ({"device": 40, "host": 0, "store": 28, "ssd": 8, "inflight": 0, "computed": 74},
                                   "responses")
    no_tiers = _req(100, 60, 64, 20)
    metric = {"computed": 40.0, "device": 50.0, "host": 0.0, "store": 10.0}
    assert tier_tokens([no_tiers], metric) == ({"computed": 40, "device": 50, "host": 0, "store": 10, "ssd": 0, "inflight": 0},
                                               "metrics")
    assert tier_tokens([no_tiers])[1] == "unknown"


def test_summarize_round_by_hand():
    a = _req(100, 60, 64, 20, tiers={"device": 40, "host": 0, "store": 20}, ttft=1.0, itl=[0.1, 0.3])
    b = _req(50, 16, 32, 10, tiers={"device": 0, "host": 0, "store": 16}, ttft=3.0, itl=[0.2])
    failed = _req(70, 0, 48, 15, error="HTTP 503")
    row = summarize_round(1, [a, b, failed], usable_pages=15, wall_s=2.0,
                          counters={"store_pages_read": 9, "store_pages_written": 12, "store_pages_evicted": 3},
                          rss_mb={"prefill-0": 100.0})
    assert row["requests"] == 3 and row["failed"] == 1 and row["errors"] == ["HTTP 503"]
    assert row["prompt_tokens"] == 150 and row["cached_tokens"] == 76 and row["ideal_tokens"] == 96
    assert row["hit_rate"] == pytest.approx(76 / 150)
    assert row["ideal_hit_rate"] == pytest.approx(96 / 150)
    # working set 20 + 10 = 30 pages (the failed request does not count), usable 15 -> factor 0.5
    assert row["previous_context_pages"] == 30 and row["capacity_factor"] == 0.5
    assert row["capacity_ideal_hit_rate"] == pytest.approx(48 / 150)
    assert row["ttft_mean_s"] == 2.0 and row["ttft_p50_s"] == 2.0
    assert row["ttft_p90_s"] == pytest.approx(2.8)           # 1 + 0.9 x (3 - 1)
    assert row["itl_p50_s"] == pytest.approx(0.2)             # [0.1, 0.2, 0.3]
    assert row["input_tok_s"] == 75.0 and row["output_tok_s"] == 4.0   # 150 / 2 s, 8 / 2 s
    assert row["tier_tokens"] == {"device": 40, "host": 0, "store": 36, "ssd": 0, "inflight": 0, "computed": 74}
    assert (row["store_pages_read"], row["store_pages_written"], row["store_pages_evicted"]) == (9, 12, 3)
    assert row["rss_mb"] == {"prefill-0": 100.0}
    assert row["free_l1_capacity_ideal_hit_rate"] is None  # not asked for


def test_free_l1_capacity_ideal_counts_only_the_l1_the_longest_prompt_leaves_free():
    a = _req(100, 60, 64, 20)  # 100 tokens = 7 pages of 16
    b = _req(50, 16, 32, 10)   # 4 pages
    # store 10 pages at its watermark + L1 12 pages - the longest prompt's 7 = 15 of a 30-page working set
    row = summarize_round(1, [a, b], usable_pages=22, wall_s=1.0, capacity=(10, 12, 16))
    assert row["longest_prompt_pages"] == 7
    assert row["capacity_factor"] == pytest.approx(22 / 30)
    assert row["free_l1_capacity_ideal_hit_rate"] == pytest.approx(96 * 0.5 / 150)
    assert free_l1_usable_pages(10, 5, 7) == 10  # a prompt larger than L1 leaves nothing free


def _round(i, hit, ideal, cap, ttft, rss):
    return {"round": i, "hit_rate": hit, "ideal_hit_rate": ideal, "capacity_ideal_hit_rate": cap,
            "ttft_mean_s": ttft, "rss_mb": rss, "failed": 0}


def test_run_summary_fields():
    rounds = [_round(0, 0.05, 0.0, 0.0, 2.0, {"p": 100.0, "d": 50.0}),     # round 0 is never judged
              _round(1, 0.40, 0.50, 0.50, 4.0, {"p": 110.0, "d": 60.0}),   # 0.8 of both ideals
              _round(2, 0.60, 0.75, 0.60, 5.0, {"p": 120.0, "d": 80.0}),   # 0.8 / 1.0
              _round(3, 0.45, 0.80, 0.50, 10.0, {"p": 150.0, "d": 100.0})]  # 0.5625 / 0.9
    s = run_summary(rounds)
    assert s["worst_hit_over_ideal"] == pytest.approx(0.5625)
    assert s["worst_hit_over_capacity_ideal"] == pytest.approx(0.8)
    assert s["ttft_last_over_round1"] == pytest.approx(10.0 / 4.0)
    # after the last round over after round 2: p 150/120 = 1.25, d 100/80 = 1.25 -> 1.25
    assert s["rss_growth_ratio"] == pytest.approx(1.25)
    assert s["failed_requests"] == 0
    assert s["worst_hit_over_free_l1_capacity_ideal"] is None  # no round has it
    assert s["preemptions"] is None and s["preemptions_per_min"] is None  # not scraped
    for r, n in zip(rounds, (0, 2, 0, 1)):
        r["preemptions"], r["wall_s"] = n, 30.0
    s = run_summary(rounds)
    assert s["preemptions"] == 3 and s["preemptions_per_min"] == pytest.approx(3 / 2.0)


def test_rss_growth_uses_the_last_round_when_there_are_fewer_than_three():
    rounds = [_round(0, 0.0, 0.0, 0.0, 1.0, {"p": 100.0}), _round(1, 0.5, 0.5, 0.5, 1.0, {"p": 130.0})]
    assert rss_growth_ratio(rounds) == 1.0
    assert rss_growth_ratio([]) is None
