"""bench/trace/summary.py on replayed requests made up here (page size 4): hit rate over answered
requests, the ideals, goodput under the SLOs, tiers, errors and the time bins."""

from __future__ import annotations

from bench.trace.replay import Sent
from bench.trace.summary import summarize

P = list(range(1, 9))


def sent(pos, prompt, at, ttft, end, cached=0, itl=(), tiers=None, error=None, out=(7, 8)):
    return Sent(position=pos, session="s", prompt_ids=list(prompt), output_tokens=len(out), sent_s=at,
                first_token_s=None if ttft is None else at + ttft, end_s=end, prompt_tokens=len(prompt),
                output_ids=list(out), cached_tokens=cached, tiers=tiers, ttft_s=ttft, itl_s=list(itl), error=error)


def test_summary_by_hand():
    tiers = {"device": 0, "host": 0, "store": 0, "ssd": 0, "inflight": 0}
    runs = [sent(0, P + [9], 0.0, 0.5, 1.0, itl=[0.05], tiers=tiers),
            # 9 tokens, 2 reusable pages, both from request 0: instant 8; sent at 0.2, before its first token
            sent(1, P + [10], 0.2, 3.0, 3.5, cached=8, itl=[0.05], tiers={**tiers, "inflight": 8}),
            sent(2, P + [11], 70.0, 0.1, 70.5, cached=4, itl=[0.5, 0.1], tiers={**tiers, "device": 4}),
            sent(3, P + [12], 80.0, None, 80.1, error="HTTP 500: boom", out=())]
    s = summarize(runs, page_size=4, slo_ttft_s=1.0, slo_itl_s=0.2, bin_s=60.0)
    # answered: 3 requests of 9 tokens; cached 0 + 8 + 4; instant 0 + 8 + 8; causal 0 + 0 + 8
    assert (s["requests"], s["errors"], s["prompt_tokens"], s["cached_tokens"]) == (4, 1, 27, 12)
    assert (s["instant_ideal_tokens"], s["causal_ideal_tokens"]) == (16, 8)
    assert s["hit_rate"] == 12 / 27 and s["hit_over_instant_ideal"] == 12 / 16 and s["hit_over_causal_ideal"] == 12 / 8
    # SLOs: request 0 meets both; 1's TTFT 3.0 > 1.0; 2's mean ITL 0.3 > 0.2 -> 1 over 80.1 s
    assert s["slo_met"] == 1 and s["goodput_rps"] == 1 / 80.1 and s["wall_s"] == 80.1
    assert s["tier_tokens"] == {"device": 4, "host": 0, "store": 0, "ssd": 0, "inflight": 8, "computed": 15}
    assert s["error_samples"] == ["HTTP 500: boom"] and s["ttft_p50_s"] == 0.5
    assert [(b["bin"], b["requests"], b["errors"], b["cached_tokens"]) for b in s["bins"]] == [(0, 2, 0, 8),
                                                                                                (1, 2, 1, 4)]
