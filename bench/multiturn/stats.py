"""The arithmetic of `pdorch bench multiturn`: ideals, percentiles, tier split, per-round and
whole-run JSON fields. Pure (no I/O, no clock), so every number is unit-tested on fixed inputs.

Page-aligned ideal of one request (what a perfect cache could reuse, from what was sent):

    previous request:  [ prev prompt ............ | prev answer ...... ]
                                                                     ^ last answer token: its KV is
                                                                       never computed (never fed)
    this request:      [ prev prompt ............ | prev answer ...... | new user turn ....... ]
                       |<----------- shared prefix, at most prev KV ----->|
                       |<- floor to full pages ->|    and never the page holding the last prompt
                                                      token (its logits give the first token)

Capacity-bound ideal of a round: the ideal times min(1, usable pages / full pages of all previous
contexts of the round), usable = store capacity x the master's eviction high watermark (in pages)
+ the prefill workers' L1 pages: no policy can keep more than that. The free-L1 variant (the sweep's,
`free_l1_capacity_ideal_hit_rate`) counts only the L1 pages the round's longest prompt leaves free:
a prompt being prefilled occupies its pages in L1.
"""

from __future__ import annotations

import dataclasses
import math

from pdorch.worker.prefill_rpc import CACHE_TIERS

TIERS = CACHE_TIERS  # device, host, store, ssd (the store's SSD tier: 0 without it), as responses name them


# ---------------------------------------------------------------------------------- per request
def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def ideal_cached_tokens(prompt: list[int], prev_context: list[int], prev_kv_tokens: int, page_size: int) -> int:
    """Tokens of `prompt` a perfect page cache reuses from the previous request.

    `prev_context` is the previous prompt + answer ids, `prev_kv_tokens` how many of them ever had
    their KV computed (prompt + answer - 1)."""
    shared = min(common_prefix_len(prompt, prev_context), prev_kv_tokens)
    last_page_start = (len(prompt) - 1) // page_size * page_size  # the page with the last prompt token
    return min(shared // page_size * page_size, last_page_start)


def usable_capacity_pages(store_capacity_bytes: int, high_watermark: float, page_bytes: int, l1_pages: int) -> int:
    """Pages any policy could keep: the store up to its eviction watermark plus every prefill L1."""
    store = int(store_capacity_bytes * high_watermark) // page_bytes if page_bytes > 0 else 0
    return store + l1_pages


def free_l1_usable_pages(store_pages: int, l1_pages: int, longest_prompt_pages: int) -> int:
    """The store at its watermark plus the L1 pages the round's longest prompt leaves free."""
    return store_pages + max(0, l1_pages - longest_prompt_pages)


def capacity_factor(usable_pages: int, previous_context_pages: int) -> float:
    """min(1, usable / working set); 1 when nothing is worth keeping yet."""
    if previous_context_pages <= 0:
        return 1.0
    return min(1.0, usable_pages / previous_context_pages)


# ---------------------------------------------------------------------------------- percentiles
def percentile(values: list[float], q: float) -> float | None:
    """q in [0, 100], linear interpolation between closest ranks (numpy's default); None if empty."""
    if not values:
        return None
    s = sorted(values)
    rank = (len(s) - 1) * q / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (rank - lo)


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def ratio(num: float | None, den: float | None) -> float | None:
    if num is None or not den:
        return None
    return num / den


# ---------------------------------------------------------------------------------- per round
@dataclasses.dataclass
class RequestResult:
    """One request as sent and answered. `tiers` is None when the API does not report them."""

    client: int
    round: int
    prompt_tokens: int              # len of the ids sent (the router's count for OpenAI)
    ideal_tokens: int               # ideal_cached_tokens of this request
    previous_context_pages: int     # full pages of the previous request's KV (0 in round 0)
    cached_tokens: int = 0
    tiers: dict | None = None       # {"device": n, "host": n, "store": n}
    output_tokens: int = 0
    ttft_s: float | None = None
    itl_s: list = dataclasses.field(default_factory=list)
    start_s: float = 0.0            # seconds since the run started
    end_s: float = 0.0
    error: str | None = None


def tier_tokens(results: list[RequestResult], metric_tiers: dict | None = None) -> tuple[dict, str]:
    """Prompt tokens by where they came from: computed + each cache tier; and the source of the split.

    From the responses when every one reports tiers, else from the workers' counters (`metric_tiers`:
    the round's delta of {"computed", "device", "host", "store", "ssd", "inflight"}), else unknown (None values)."""
    ok = [r for r in results if r.error is None]
    prompt = sum(r.prompt_tokens for r in ok)
    if ok and all(r.tiers is not None for r in ok):
        split = {t: sum(r.tiers.get(t, 0) for r in ok) for t in TIERS}
        split["computed"] = prompt - sum(split.values())
        return split, "responses"
    if metric_tiers is not None:
        return {k: int(metric_tiers.get(k, 0)) for k in ("computed",) + TIERS}, "metrics"
    return {k: None for k in ("computed",) + TIERS}, "unknown"


def summarize_round(round_index: int, results: list[RequestResult], usable_pages: int, wall_s: float,
                    counters: dict | None = None, metric_tiers: dict | None = None,
                    rss_mb: dict | None = None, capacity: tuple[int, int, int] | None = None) -> dict:
    """The JSON object of one round. `counters` = deltas over the round of store_pages_read /
    _written / _evicted and the drop / miss counters by reason; `rss_mb` = {process: MiB} at its end;
    `capacity` = (store pages at the watermark, L1 pages, page size) for the free-L1 capacity ideal."""
    ok = [r for r in results if r.error is None]
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    ideal = sum(r.ideal_tokens for r in ok)
    context_pages = sum(r.previous_context_pages for r in ok)
    factor = capacity_factor(usable_pages, context_pages)
    longest = max((-(-r.prompt_tokens // capacity[2]) for r in ok), default=0) if capacity else 0
    free_factor = (capacity_factor(free_l1_usable_pages(capacity[0], capacity[1], longest), context_pages)
                   if capacity else None)
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    itls = [x for r in ok for x in r.itl_s]
    split, source = tier_tokens(results, metric_tiers)
    counters = counters or {}
    return {
        "round": round_index,
        "requests": len(results),
        "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if r.error})[:3],
        "prompt_tokens": prompt,
        "output_tokens": sum(r.output_tokens for r in ok),
        "cached_tokens": cached,
        "ideal_tokens": ideal,
        "hit_rate": ratio(cached, prompt),
        "ideal_hit_rate": ratio(ideal, prompt),
        "previous_context_pages": context_pages,
        "capacity_factor": factor,
        "capacity_ideal_hit_rate": ratio(ideal * factor, prompt),
        "longest_prompt_pages": longest if capacity else None,
        "free_l1_capacity_ideal_hit_rate": ratio(ideal * free_factor, prompt) if capacity else None,
        "ttft_mean_s": mean(ttfts),
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p90_s": percentile(ttfts, 90),
        "itl_p50_s": percentile(itls, 50),
        "itl_p90_s": percentile(itls, 90),
        "wall_s": wall_s,
        "input_tok_s": ratio(prompt, wall_s),
        "output_tok_s": ratio(sum(r.output_tokens for r in ok), wall_s),
        "tier_tokens": split,
        "tier_source": source,
        "store_pages_read": counters.get("store_pages_read"),
        "store_pages_written": counters.get("store_pages_written"),
        "store_pages_evicted": counters.get("store_pages_evicted"),
        "store_pages_evicted_by_pdorch": counters.get("store_pages_evicted_by_pdorch"),
        "reads": counters.get("reads") or {},
        "store_save_dropped_pages": counters.get("store_save_dropped_pages", {}),
        "store_load_miss_pages": counters.get("store_load_miss_pages", {}),
        "p2d_bytes_per_request": ratio(counters.get("transfer_bytes"), len(ok)),
        "prefill_calls_avoided": (counters.get("prompt_plans") or {}).get("local"),
        "preemptions": counters.get("preemptions"),
        "rss_mb": dict(rss_mb or {}),
    }


# ---------------------------------------------------------------------------------- whole run
def worst_ratio(rounds: list[dict], key: str) -> float | None:
    """min over rounds >= 1 of hit_rate / rounds[key]; rounds whose ideal is 0 say nothing."""
    values = [r["hit_rate"] / r[key] for r in rounds
              if r["round"] >= 1 and r["hit_rate"] is not None and r[key]]
    return min(values) if values else None


def rss_growth_ratio(rounds: list[dict]) -> float | None:
    """Largest, over processes, RSS after the last round / RSS after round 2 (the last one if fewer)."""
    if not rounds:
        return None
    ref, last = rounds[min(2, len(rounds) - 1)]["rss_mb"], rounds[-1]["rss_mb"]
    values = [last[p] / ref[p] for p in last if ref.get(p)]
    return max(values) if values else None


def run_summary(rounds: list[dict]) -> dict:
    """The headline fields of the JSON line."""
    ttft1 = rounds[1]["ttft_mean_s"] if len(rounds) > 1 else None
    return {
        "worst_hit_over_ideal": worst_ratio(rounds, "ideal_hit_rate"),
        "worst_hit_over_capacity_ideal": worst_ratio(rounds, "capacity_ideal_hit_rate"),
        "worst_hit_over_free_l1_capacity_ideal": worst_ratio(
            [r for r in rounds if r.get("free_l1_capacity_ideal_hit_rate") is not None],
            "free_l1_capacity_ideal_hit_rate"),
        "store_pages_evicted": _sum(rounds, "store_pages_evicted"),
        "store_pages_evicted_by_pdorch": _sum(rounds, "store_pages_evicted_by_pdorch"),
        "ttft_last_over_round1": ratio(rounds[-1]["ttft_mean_s"], ttft1) if rounds else None,
        "rss_growth_ratio": rss_growth_ratio(rounds),
        "failed_requests": sum(r["failed"] for r in rounds),
        "preemptions": _sum(rounds, "preemptions"),
        "preemptions_per_min": ratio(_sum(rounds, "preemptions"), (_sum(rounds, "wall_s") or 0) / 60),
    }


def _sum(rounds: list[dict], key: str) -> float | None:
    values = [r.get(key) for r in rounds]
    return None if any(v is None for v in values) else sum(values)


def rounded(obj, digits: int = 4):
    """Floats rounded for the JSON line (nested dicts and lists too)."""
    if isinstance(obj, float):
        return round(obj, digits)
    if isinstance(obj, dict):
        return {k: rounded(v, digits) for k, v in obj.items()}
    if isinstance(obj, list):
        return [rounded(v, digits) for v in obj]
    return obj
