"""Human tables of `pdorch bench trace`: one column per run (the --compare-inflight pair side by
side), then the per-bin rates of each run. Missing values print as "-"."""

from __future__ import annotations

from bench.multiturn.stats import TIERS

_ROWS = (("requests", "d"), ("errors", "d"), ("prompt_tokens", "d"), ("cached_tokens", "d"),
         ("hit_rate", ".3f"), ("instant_ideal_hit_rate", ".3f"), ("causal_ideal_hit_rate", ".3f"),
         ("hit_over_instant_ideal", ".3f"), ("hit_over_causal_ideal", ".3f"),
         ("ttft_p50_s", ".3f"), ("ttft_p90_s", ".3f"), ("ttft_p99_s", ".3f"),
         ("itl_p50_s", ".4f"), ("itl_p90_s", ".4f"), ("itl_p99_s", ".4f"),
         ("slo_met", "d"), ("goodput_rps", ".3f"), ("wall_s", ".1f"))


def _f(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def runs_table(runs: list[dict]) -> str:
    width = max(14, *(len(r["name"]) + 2 for r in runs))
    lines = [f"{'':<26}" + "".join(f"{r['name']:>{width}}" for r in runs)]
    for key, fmt in _ROWS:
        lines.append(f"{key:<26}" + "".join(f"{_f(r[key], fmt):>{width}}" for r in runs))
    for tier in ("computed",) + TIERS:
        lines.append(f"{'tokens ' + tier:<26}" + "".join(f"{_f(r['tier_tokens'].get(tier), 'd'):>{width}}"
                                                        for r in runs))
    lines.append(f"{'prefill computed tokens':<26}" + "".join(
        f"{_f((r['counters'] or {}).get('prefill_computed_tokens'), 'd'):>{width}}" for r in runs))
    lines.append(f"{'in-flight waits P / D':<26}" + "".join(
        f"{_waits(r, 'inflight_waits') + ' / ' + _waits(r, 'decode_inflight_waits'):>{width}}" for r in runs))
    for r in runs:
        if r["error_samples"]:
            lines.append(f"errors of {r['name']}: {r['error_samples']}")
    return "\n".join(lines)


def _waits(run: dict, key: str) -> str:
    waits = (run["counters"] or {}).get(key)
    if waits is None:
        return "-"
    return ",".join(f"{k[0]}{v}" for k, v in sorted(waits.items()) if v) or "0"


def bins_table(run: dict) -> str:
    lines = [f"{run['name']}: from s   reqs  hit    instant causal  TTFT p50 s"]
    for b in run["bins"]:
        lines.append(f"{b['start_s']:>{len(run['name']) + 9}.0f} {b['requests']:>6}  {_f(b['hit_rate'], '.3f')}  "
                     f"{_f(b['instant_ideal_hit_rate'], '.3f')}   {_f(b['causal_ideal_hit_rate'], '.3f')}  "
                     f"{_f(b['ttft_p50_s'], '.3f')}")
    return "\n".join(lines)
