"""The PNG of `pdorch bench trace`: per time bin (--bin-s, a minute by default) of the requests sent
in it, the hit rate of every run against its instant and causal ideals, and the median TTFT."""

from __future__ import annotations

from pathlib import Path


def _values(run: dict, key: str) -> list[float]:
    return [float("nan") if b[key] is None else b[key] for b in run["bins"]]


def plot_bins(runs: list[dict], title: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # NOTE: no display here; chosen before pyplot is imported
    import matplotlib.pyplot as plt

    fig, (hit, ttft) = plt.subplots(1, 2, figsize=(12, 4.5), dpi=80)
    fig.suptitle(title, fontsize=10)
    for i, run in enumerate(runs):
        x = [b["start_s"] / 60 for b in run["bins"]]
        color = f"C{i}"
        hit.plot(x, _values(run, "hit_rate"), "o-", color=color, label=f"hit rate {run['name']}")
        hit.plot(x, _values(run, "instant_ideal_hit_rate"), "x--", color=color,
                 label=f"instant ideal {run['name']}")
        hit.plot(x, _values(run, "causal_ideal_hit_rate"), "+:", color=color,
                 label=f"causal ideal {run['name']}")
        ttft.plot(x, _values(run, "ttft_p50_s"), "o-", color=color, label=run["name"])
    hit.set(xlabel="minutes (requests sent in the bin)", ylabel="cached / prompt tokens", ylim=(0, 1.02),
            title="hit rate vs ideals")
    hit.legend(fontsize=7)
    ttft.set(xlabel="minutes (requests sent in the bin)", ylabel="median TTFT (s)", title="TTFT")
    ttft.set_ylim(bottom=0)
    ttft.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
