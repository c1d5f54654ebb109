"""What `pdorch bench soak` (and `pdorch bench overload`) read from the cluster besides HTTP answers,
and how the soak's RSS series is judged and drawn:

    pool_states / wait_idle   every worker's Stats over gRPC (free, total and active pages, queued and
                              running requests, check_integrity()), the way pdorch/local_stack/workers.py
                              reads them; "leaked" = pages missing from the free count once idle
    start_cluster             `pdorch serve` (1 P + 1 D) on free ports with the benchmark's --set flags
    rss_drift                 per process: median RSS just after warm-up vs median RSS at the end of
                              the traffic, and the largest excursion of any later sample
    plot_rss                  PNG of RSS over time per process, warm-up end and the +-10% band marked
    window_table              the per-window hit rate against the ideal and evictions by evictor
"""

from __future__ import annotations

import statistics
import sys
import time

import grpc

from bench.multiturn.cluster import ServeCluster, effective_config, port_overrides
from pdorch.config_loader import ConfigError, default_config_path, exit_on_config_error
from proto.pdorch.v1 import worker_pb2 as pb
from proto.pdorch.v1 import worker_pb2_grpc as pb_grpc

IDLE_TIMEOUT_S = 120.0


def sayer(to_stderr: bool):
    """Progress lines: to stderr when stdout carries the JSON line."""
    return (lambda m: print(m, file=sys.stderr, flush=True)) if to_stderr else (lambda m: print(m, flush=True))


def start_cluster(args, bench_sets: list[str], prog: str, say) -> tuple[ServeCluster, list[str]]:
    """`pdorch serve` with 1 prefill + 1 decode worker: the benchmark's --set flags, then the user's
    --config / --set (which win), then free ports. Returns the started cluster and every --set flag."""
    args.config = args.config or str(default_config_path())
    sets = bench_sets + args.config_overrides
    try:
        effective_config(args.config, sets)
    except ConfigError as e:
        exit_on_config_error(e, prog)
    sets += port_overrides(1, 1)
    cluster = ServeCluster(args.config, sets, 1, 1, args.log_dir).start()
    say(f"cluster ready at {cluster.url} (logs in {cluster.log_dir}); --set {' '.join(sets)}")
    return cluster, sets


def worker_addresses(cfg, num_prefill: int, num_decode: int) -> dict[str, tuple[str, str]]:
    """{name: (role, host:port)}, named like ServeCluster.processes() names the processes."""
    def host(h: str) -> str:
        return "127.0.0.1" if h in ("0.0.0.0", "") else h
    out = {f"prefill-{i}": ("prefill", f"{host(cfg.prefill.host)}:{cfg.prefill.port + i}") for i in range(num_prefill)}
    out.update({f"decode-{i}": ("decode", f"{host(cfg.decode.host)}:{cfg.decode.port + i}") for i in range(num_decode)})
    return out


def _channel(address: str, cfg) -> grpc.Channel:
    rpc = getattr(cfg, "grpc", None)  # NOTE: the worker token / TLS section, where the config has one
    if rpc is not None and (getattr(rpc, "token", "") or getattr(rpc, "tls", False)):
        from pdorch.worker.rpc import client_channel
        return client_channel(address, rpc)
    return grpc.insecure_channel(address)


def pool_states(cfg, addresses: dict) -> dict[str, dict]:
    """One Stats call per worker; {name: {...}} or {name: {"error": ...}} when it does not answer."""
    out = {}
    for name, (role, address) in addresses.items():
        with _channel(address, cfg) as ch:
            stub = pb_grpc.PrefillServiceStub(ch) if role == "prefill" else pb_grpc.DecodeServiceStub(ch)
            try:
                st = stub.Stats(pb.StatsRequest(), timeout=30)
            except grpc.RpcError as e:
                out[name] = {"error": f"{e.code().name}: {e.details()}"[:200]}
                continue
        out[name] = {"free_pages": st.info.free_pages, "total_pages": st.info.total_pages,
                     "active_pages": st.active_pages, "running": st.info.running_requests,
                     "queued": st.info.queued_requests, "integrity_ok": st.pool_integrity_ok,
                     "integrity_error": st.pool_integrity_error, "requests_failed": st.requests_failed,
                     "requests_aborted": st.requests_aborted}
    return out


def _idle(s: dict) -> bool:
    return "error" not in s and s["active_pages"] == 0 and s["running"] == 0 and s["queued"] == 0


def wait_idle(cfg, addresses: dict, timeout_s: float = IDLE_TIMEOUT_S) -> tuple[dict, float]:
    """Pool states once no request holds a page on any worker (write-backs and offloads drained), or
    the last states seen at the deadline; and the seconds it took."""
    t0 = time.monotonic()
    while True:
        states = pool_states(cfg, addresses)
        if all(_idle(s) for s in states.values()) or time.monotonic() - t0 > timeout_s:
            return states, time.monotonic() - t0
        time.sleep(0.5)


def leaked_pages(baseline: dict, end: dict) -> dict[str, int | None]:
    """Free pages each worker had when idle at the start minus what it has idle at the end (None: no
    answer). Idle, every page is free or an evictable cache page, both counted in free_pages."""
    out = {}
    for name, b in baseline.items():
        e = end.get(name, {})
        out[name] = None if "error" in b or "error" in e else max(0, b["free_pages"] - e["free_pages"])
    return out


def rss_drift(series: list[tuple[float, dict]], warm_s: float, end_s: float, window_s: float) -> dict[str, dict]:
    """{process: {warm_mb, end_mb, end_over_warm, max_growth, min_over_warm}}: warm = median of the
    samples in [warm_s, warm_s + window_s], end = median of those in [end_s - window_s, end_s] (medians:
    one sample can catch a batch's transient buffers); max_growth = max(sample / warm - 1, 0) over the
    samples after warm_s (what a leak looks like), min_over_warm = the lowest sample / warm (memory
    given back, e.g. the allocator trimming its arenas, is not a leak but is reported)."""
    out = {}
    names = sorted({n for _, sample in series for n in sample})
    for n in names:
        pts = [(t, s[n]) for t, s in series if n in s]
        warm = [v for t, v in pts if warm_s <= t <= warm_s + window_s]
        end = [v for t, v in pts if end_s - window_s <= t <= end_s]
        if not warm or not end:
            continue
        w = statistics.median(warm)
        after = [v / w for t, v in pts if warm_s <= t <= end_s]
        out[n] = {"warm_mb": round(w, 1), "end_mb": round(statistics.median(end), 1),
                  "end_over_warm": round(statistics.median(end) / w, 4),
                  "max_growth": round(max(max(after) - 1, 0.0), 4), "min_over_warm": round(min(after), 4)}
    return out


def plot_rss(series: list[tuple[float, dict]], warm_s: float, drift: dict, title: str, path) -> str:
    import matplotlib

    matplotlib.use("Agg")  # NOTE: no display here; must be chosen before pyplot is imported
    import matplotlib.pyplot as plt

    names = sorted({n for _, s in series for n in s})
    fig, axes = plt.subplots(len(names), 1, figsize=(10, 1.9 * len(names) + 0.8), dpi=80, sharex=True)
    fig.suptitle(title, fontsize=10)
    for ax, n in zip(axes if len(names) > 1 else [axes], names, strict=True):
        pts = [(t / 60, s[n]) for t, s in series if n in s]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], ".-", ms=3, lw=1)
        ax.axvline(warm_s / 60, color="grey", ls=":", lw=1)
        if n in drift:
            w = drift[n]["warm_mb"]
            ax.axhspan(w * 0.9, w * 1.1, color="green", alpha=0.08)
            n += f"  end/warm {drift[n]['end_over_warm']:.3f}"
        ax.set_ylabel("MiB", fontsize=8)
        ax.set_title(n, fontsize=8, loc="left")
        ax.tick_params(labelsize=7)
    (axes[-1] if len(names) > 1 else axes).set_xlabel("minutes (dotted: end of warm-up; band: warm-up RSS +-10%)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return str(path)


def window_table(windows: list[dict]) -> str:
    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    lines = ["window        requests   hit  ideal  hit/ideal  evicted by master / pdorch"]
    for w in windows:
        span = f"{w['start_s'] / 60:.1f}-{w['end_s'] / 60:.1f} min" + (" (warm-up)" if w["warmup"] else "")
        lines.append(f"{span:<22} {w['requests']:>4}  {f(w['hit_rate'], '.3f')}  {f(w['ideal_hit_rate'], '.3f')}  "
                     f"{f(w['hit_over_ideal'], '9.3f')}  {f(w['master_evicted'], '.0f'):>8} / {f(w['pdorch_evicted'], '.0f')}")
    return "\n".join(lines)
