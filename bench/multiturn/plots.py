"""PNG plots of `pdorch bench multiturn`: one figure of four panels per run.

    hit rate per round against the page-aligned and the capacity-bound ideal (every variant)
    mean TTFT per round (every variant)
    where prompt tokens came from per round (computed / device / host / store), first variant
    RSS of every watched process over time, round ends marked, first variant
"""

from __future__ import annotations

from pathlib import Path

_TIER_COLORS = {"computed": "#bbbbbb", "device": "#4c72b0", "host": "#55a868", "store": "#dd8452", "ssd": "#8172b2", "inflight": "#c44e52"}


def plot_run(variants: dict[str, dict], title: str, path: Path) -> Path:
    """`variants` = {name: run result with "rounds" and "rss_series"}; the first one is detailed."""
    import matplotlib

    matplotlib.use("Agg")  # NOTE: no display here; must be chosen before pyplot is imported
    import matplotlib.pyplot as plt

    first_name = next(iter(variants))
    first = variants[first_name]
    rounds = [r["round"] for r in first["rounds"]]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), dpi=80)
    fig.suptitle(title, fontsize=11)

    ax = axes[0][0]
    ax.plot(rounds, [r["ideal_hit_rate"] for r in first["rounds"]], "k--", label="page-aligned ideal")
    ax.plot(rounds, [r["capacity_ideal_hit_rate"] for r in first["rounds"]], "k:",
            label=f"capacity-bound ideal ({first_name})")
    for name, res in variants.items():
        ax.plot([r["round"] for r in res["rounds"]], [r["hit_rate"] for r in res["rounds"]], "o-",
                label=f"hit rate {name}")
    ax.set(xlabel="round", ylabel="cached / prompt tokens", ylim=(0, 1.02), title="hit rate vs ideals")
    ax.legend(fontsize=7)

    ax = axes[0][1]
    for name, res in variants.items():
        ax.plot([r["round"] for r in res["rounds"]], [r["ttft_mean_s"] for r in res["rounds"]], "o-", label=name)
    ax.set(xlabel="round", ylabel="mean TTFT (s)", title="TTFT per round")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)

    ax = axes[1][0]
    bottom = [0.0] * len(rounds)
    for tier, color in _TIER_COLORS.items():
        values = [(r["tier_tokens"].get(tier) or 0) / max(1, r["prompt_tokens"]) for r in first["rounds"]]
        ax.bar(rounds, values, bottom=bottom, color=color, label=tier)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set(xlabel="round", ylabel="share of prompt tokens", ylim=(0, 1.02), title=f"tier split ({first_name})")
    ax.legend(fontsize=7)

    ax = axes[1][1]
    series = sorted(first.get("rss_series") or [], key=lambda x: x[0])
    names = sorted({n for _, rss in series for n in rss})
    for n in names:
        ax.plot([t for t, rss in series if n in rss], [rss[n] for _, rss in series if n in rss], ".-", ms=3,
                label=n)
    for r in first["rounds"]:
        ax.axvline(r.get("end_s", 0), color="#dddddd", lw=0.8)
    ax.set(xlabel="seconds (grey: round ends)", ylabel="RSS (MiB)", title=f"RSS ({first_name})")
    ax.set_ylim(bottom=0)
    if names:
        ax.legend(fontsize=7)

    for a in (axes[0][0], axes[0][1], axes[1][0]):
        a.set_xticks(rounds)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
