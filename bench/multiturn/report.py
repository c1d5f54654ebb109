"""Human tables of `pdorch bench multiturn`: one row per round, RSS per process, and the --compare
summary. Missing values print as "-"."""

from __future__ import annotations

from bench.multiturn.stats import TIERS


def _f(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _ms(value) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def round_table(rounds: list[dict]) -> str:
    head = ("round  reqs fail  ttft mean/p50/p90 s   itl p50/p90 ms  in tok/s out tok/s   hit  ideal  cap-ideal"
            "  computed/device/host/store/ssd tokens   store read/written pages, evicted by master/pdorch")
    lines = [head]
    for r in rounds:
        t = r["tier_tokens"]
        tiers = "/".join(_f(t[k], "d") for k in ("computed",) + TIERS)
        store = ("/".join(_f(r[k], "d") for k in ("store_pages_read", "store_pages_written")) + ", "
                 + "/".join(_f(r.get(k), "d") for k in ("store_pages_evicted", "store_pages_evicted_by_pdorch")))
        lines.append(
            f"{r['round']:>5} {r['requests']:>5} {r['failed']:>4}  "
            f"{_f(r['ttft_mean_s'], '6.2f')} {_f(r['ttft_p50_s'], '6.2f')} {_f(r['ttft_p90_s'], '6.2f')}   "
            f"{_ms(r['itl_p50_s']):>5} {_ms(r['itl_p90_s']):>5}   {_f(r['input_tok_s'], '8.0f')} "
            f"{_f(r['output_tok_s'], '8.1f')}  {_f(r['hit_rate'], '.3f')}  {_f(r['ideal_hit_rate'], '.3f')}  "
            f"{_f(r['capacity_ideal_hit_rate'], '9.3f')}  {tiers:>34}   {store}")
    holes = [(r["round"], r["store_save_dropped_pages"], r["store_load_miss_pages"]) for r in rounds
             if r["store_save_dropped_pages"] or r["store_load_miss_pages"]]
    for rnd, dropped, missed in holes:
        lines.append(f"  round {rnd}: write-backs dropped {dropped or {}}, store load misses {missed or {}}")
    return "\n".join(lines)


TIER_COLUMNS = ("prefill_l1", "prefill_from_decode", "prefill_store", "decode_l1", "decode_store")


def reads_table(rounds: list[dict]) -> str:
    """Where each round's reused pages came from: P's L1, D's pool (read by P), the store (read by P),
    D's own prefix cache, the store (read by D); and the free-L1 capacity-bound ideal."""
    lines = [("round  reused pages: P L1 / P from D's pool / P from store / D's cache / D from store"
             "   free-L1 cap-ideal")]
    for r in rounds:
        reads = r.get("reads") or {}
        cells = " / ".join(_f(reads.get(k), "d") for k in TIER_COLUMNS)
        lines.append(f"{r['round']:>5}  {cells:>75}   {_f(r.get('free_l1_capacity_ideal_hit_rate'), '.3f')}")
    return "\n".join(lines)


def rss_table(rounds: list[dict]) -> str:
    names = sorted({n for r in rounds for n in r["rss_mb"]})
    if not names:
        return "RSS: no local processes watched"
    lines = ["RSS at round end (MiB)  " + "  ".join(f"{n:>10}" for n in names)]
    for r in rounds:
        lines.append(f"round {r['round']:>2}                " + "  ".join(
            f"{_f(r['rss_mb'].get(n), '10.0f')}" for n in names))
    return "\n".join(lines)


def summary_lines(res: dict) -> str:
    return (f"worst hit/ideal {_f(res['worst_hit_over_ideal'], '.3f')}, worst hit/capacity ideal "
            f"{_f(res['worst_hit_over_capacity_ideal'], '.3f')}, TTFT last/round 1 "
            f"{_f(res['ttft_last_over_round1'], '.2f')}, RSS growth {_f(res['rss_growth_ratio'], '.3f')}, "
            f"failed requests {res['failed_requests']}; usable capacity {res['usable_pages']} pages "
            f"(store {res['store_capacity_bytes'] / (1 << 20):.0f} MiB x {res['eviction_high_watermark']} "
            f"+ L1 {res['l1_pages']}); worst hit/free-L1 capacity ideal "
            f"{_f(res.get('worst_hit_over_free_l1_capacity_ideal'), '.3f')}; store pages evicted by "
            f"mooncake_master {_f(res.get('store_pages_evicted'), '.0f')}, by pdorch "
            f"{_f(res.get('store_pages_evicted_by_pdorch'), '.0f')}; decode preemptions "
            f"{_f(res.get('preemptions'), '.0f')} ({_f(res.get('preemptions_per_min'), '.2f')} per minute)")


def compare_table(variants: dict[str, dict]) -> str:
    names = list(variants)
    first = variants[names[0]]["rounds"]
    lines = ["round  ideal  " + "  ".join(f"{'hit ' + n:>14}" for n in names) + "  "
             + "  ".join(f"{'TTFT s ' + n:>14}" for n in names)]
    for i, r in enumerate(first):
        rows = [variants[n]["rounds"][i] if i < len(variants[n]["rounds"]) else None for n in names]
        lines.append(f"{r['round']:>5}  {_f(r['ideal_hit_rate'], '.3f')}  "
                     + "  ".join(f"{_f(x and x['hit_rate'], '14.3f')}" for x in rows) + "  "
                     + "  ".join(f"{_f(x and x['ttft_mean_s'], '14.2f')}" for x in rows))
    lines += ["", "round  " + "  ".join(f"{'P->D MB/req ' + n:>16}" for n in names) + "  "
              + "  ".join(f"{'no-P calls ' + n:>14}" for n in names)]
    for i, r in enumerate(first):
        rows = [variants[n]["rounds"][i] if i < len(variants[n]["rounds"]) else None for n in names]
        mb = [x and x.get("p2d_bytes_per_request") for x in rows]
        lines.append(f"{r['round']:>5}  " + "  ".join(f"{_f(m and m / 1e6, '16.2f')}" for m in mb) + "  "
                     + "  ".join(f"{_f(x and x.get('prefill_calls_avoided'), '14.0f')}" for x in rows))
    return "\n".join(lines)
