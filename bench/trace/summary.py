"""The numbers of one replay: hit rate against both ideals, TTFT and ITL percentiles, goodput under
the SLOs, prompt tokens by tier, errors, and the same per time bin for the plot. Pure.

    hit rate   cached prompt tokens (the responses' meta_info) / prompt tokens, answered requests only
    goodput    answered requests with TTFT <= --slo-ttft and mean ITL <= --slo-itl (a one-token answer
               has no ITL), per second of the replay (first send to last end)
    tiers      computed + device / host / store / ssd / inflight, from cached_tokens_details
"""

from __future__ import annotations

from bench.multiturn.stats import mean, percentile, ratio, tier_tokens
from bench.trace.ideals import IdealInput, ideal_tokens
from bench.trace.replay import Sent


def ideal_inputs(sent: list[Sent]) -> list[IdealInput]:
    return [IdealInput(prompt_ids=s.prompt_ids, answer_ids=s.output_ids, sent_s=s.sent_s,
                       prompt_ready_s=s.first_token_s, answer_ready_s=s.end_s if s.error is None else None)
            for s in sent]


def meets_slo(s: Sent, slo_ttft_s: float, slo_itl_s: float) -> bool:
    itl = mean(s.itl_s)
    return s.ttft_s is not None and s.ttft_s <= slo_ttft_s and (itl is None or itl <= slo_itl_s)


def _rates(sent: list[Sent], ideal: list[tuple[int, int]]) -> dict:
    ok = [i for i, s in enumerate(sent) if s.error is None]
    prompt = sum(sent[i].prompt_tokens for i in ok)
    cached = sum(sent[i].cached_tokens for i in ok)
    instant = sum(ideal[i][0] for i in ok)
    causal = sum(ideal[i][1] for i in ok)
    ttfts = [sent[i].ttft_s for i in ok if sent[i].ttft_s is not None]
    return {"requests": len(sent), "errors": len(sent) - len(ok), "prompt_tokens": prompt, "cached_tokens": cached,
            "instant_ideal_tokens": instant, "causal_ideal_tokens": causal, "hit_rate": ratio(cached, prompt),
            "instant_ideal_hit_rate": ratio(instant, prompt), "causal_ideal_hit_rate": ratio(causal, prompt),
            "ttft_p50_s": percentile(ttfts, 50)}


def summarize(sent: list[Sent], page_size: int, slo_ttft_s: float, slo_itl_s: float, bin_s: float = 60.0) -> dict:
    ideal = ideal_tokens(ideal_inputs(sent), page_size)
    ok = [s for s in sent if s.error is None]
    ttfts = [s.ttft_s for s in ok if s.ttft_s is not None]
    itls = [x for s in ok for x in s.itl_s]
    span = (max((s.end_s or s.sent_s for s in sent), default=0.0) - min((s.sent_s for s in sent), default=0.0))
    good = sum(meets_slo(s, slo_ttft_s, slo_itl_s) for s in ok)
    split, source = tier_tokens(sent)  # NOTE: Sent has the fields it reads (error, prompt_tokens, tiers)
    out = _rates(sent, ideal)
    out.update({
        "hit_over_instant_ideal": ratio(out["hit_rate"], out["instant_ideal_hit_rate"]),
        "hit_over_causal_ideal": ratio(out["hit_rate"], out["causal_ideal_hit_rate"]),
        "output_tokens": sum(len(s.output_ids) for s in ok),
        "ttft_p90_s": percentile(ttfts, 90), "ttft_p99_s": percentile(ttfts, 99),
        "itl_p50_s": percentile(itls, 50), "itl_p90_s": percentile(itls, 90), "itl_p99_s": percentile(itls, 99),
        "slo_ttft_s": slo_ttft_s, "slo_itl_s": slo_itl_s, "slo_met": good,
        "goodput_rps": ratio(good, span), "wall_s": span, "tier_tokens": split, "tier_source": source,
        "error_samples": sorted({s.error for s in sent if s.error})[:3],
        "bins": per_bin(sent, ideal, bin_s)})
    return out


def per_bin(sent: list[Sent], ideal: list[tuple[int, int]], bin_s: float) -> list[dict]:
    """The rates of the requests sent in each `bin_s` window (the plot's points)."""
    bins: dict[int, list[int]] = {}
    for i, s in enumerate(sent):
        bins.setdefault(int(s.sent_s // bin_s), []).append(i)
    return [{"bin": b, "start_s": b * bin_s, **_rates([sent[i] for i in idx], [ideal[i] for i in idx])}
            for b, idx in sorted(bins.items())]
