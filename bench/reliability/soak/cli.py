"""Soak: N minutes of multi-turn traffic at a steady request rate against a `pdorch serve` cluster;
RSS of every process flat after warm-up, no error responses, no leaked pages.

    python -m bench.reliability.soak [--minutes 30] [--request-rate 0.5] [--json] [--plot rss.png]
    pdorch bench soak ...                       (the same)

`--clients` conversations of `--rounds` turns each (the bench/multiturn/ workload: each turn sends
the whole conversation so far); a conversation that has had its rounds starts over with new text, so
the load stays steady and the caches stay full (L1 and the store evict all the time). Arrivals are
Poisson at `--request-rate`; a conversation sends its next turn only once its answer is in, so when
the cluster falls behind, arrivals wait for a free conversation (the achieved rate says so).
RSS of every process is sampled every `--rss-interval` s. After the warm-up the run is cut into
`--windows` windows; per window: the hit rate against the page-aligned ideal of the same requests,
and the store pages evicted by mooncake_master's own eviction and by pdorch's chain eviction (their
counters read at every window's edge). After the traffic: wait until no worker holds a page, then
compare every worker's free pages with its idle start (Stats over gRPC) and check its pool's integrity.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import tempfile
import time
from pathlib import Path

from bench.multiturn.client import HttpBackend
from bench.multiturn.cluster import metrics_urls
from bench.multiturn.conversation import Conversation
from bench.multiturn.facts import commit, model_facts
from bench.multiturn.metrics import rss_mb, scrape, total
from bench.multiturn.stats import percentile
from bench.multiturn.text import TurnSource
from bench.reliability.soak import report as rep
from pdorch.config_loader import add_config_args

# NOTE: a soak measures leaks and drift, not latency: on a shared 2-core machine a prefill can wait
# behind other people's jobs for longer than the 30 s default, which would count as an error here.
# The store segments are small (2 x 64 MiB, ~180 pages) so the store is full and evicting after a few
# minutes, well inside the warm-up: a soak must see the steady state of a full cache.
SOAK_SETS = ["decode.prefill_timeout_s=120", "store.global_segment_size_mb=64"]
MAX_GROWTH = 0.05  # no process's RSS more than 5% above its warm-up RSS
MIN_HIT_OVER_IDEAL = 0.95  # every window after the warm-up
MAX_MASTER_EVICTION_SHARE = 0.05  # mooncake_master's own eviction: a backstop, not the policy


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pdorch bench soak", description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--minutes", type=float, default=30.0, help="traffic duration (default 30)")
    p.add_argument("--request-rate", type=float, default=0.3, help="Poisson arrivals per second (default 0.3)")
    p.add_argument("--clients", type=int, default=8, help="conversations in parallel (default 8)")
    p.add_argument("--rounds", type=int, default=4, help="turns before a conversation starts over (default 4)")
    p.add_argument("--first-tokens", type=int, default=128)
    p.add_argument("--turn-tokens", type=int, default=64)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--api", choices=["sglang", "openai"], default="sglang")
    p.add_argument("--warmup", type=float, default=0.2, help="fraction of the run that is warm-up (default 0.2)")
    p.add_argument("--windows", type=int, default=5, help="windows after the warm-up, each judged (default 5)")
    p.add_argument("--rss-interval", type=float, default=10.0, help="seconds between RSS samples (default 10)")
    p.add_argument("--timeout", type=float, default=300.0, help="deadline of one request (s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", help="PNG of RSS over time per process")
    p.add_argument("--log-dir", help="component logs of the cluster (default: a temp dir)")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    add_config_args(p)
    return p


class Slot:
    """One conversation seat: its current Conversation, the next round, how often it started over."""

    def __init__(self, index: int):
        self.index, self.generation, self.round, self.conv = index, 0, 0, None


async def drive(args, backend, new_conv, duration_s: float, rss_series: list, processes: dict,
                edges: list[float] = (), evictions=None, marks: list | None = None) -> list[dict]:
    """Send turns at the Poisson rate for duration_s; returns one dict per request. At each time in
    `edges` (seconds), `evictions()` (run on a thread) is appended to `marks` as (t, value)."""
    rng = random.Random(f"soak:{args.seed}")
    free: asyncio.Queue = asyncio.Queue()
    for i in range(args.clients):
        slot = Slot(i)
        slot.conv = new_conv(slot)
        free.put_nowait(slot)
    results: list[dict] = []
    t0 = time.monotonic()

    async def one(slot: Slot) -> None:
        prompt = slot.conv.next_prompt(slot.round)
        start = time.monotonic()
        reply = await backend.send(prompt)
        results.append({"start_s": start - t0, "e2e_s": time.monotonic() - start, "ttft_s": reply.ttft_s,
                        "prompt_tokens": len(prompt.ids), "cached_tokens": reply.cached_tokens,
                        "ideal_tokens": prompt.ideal_tokens, "error": reply.error})
        slot.conv.record_answer(reply.output_ids, reply.text, reply.completion_tokens, reply.finish_reason)
        slot.round += 1
        if slot.round == args.rounds:  # start over with new text: steady load, caches stay full
            slot.generation, slot.round = slot.generation + 1, 0
            slot.conv = new_conv(slot)
        free.put_nowait(slot)

    async def sample_rss() -> None:
        while True:
            sample = {n: rss_mb(pid) for n, pid in processes.items()}
            rss_series.append((round(time.monotonic() - t0, 1), {n: v for n, v in sample.items() if v is not None}))
            await asyncio.sleep(args.rss_interval)

    async def mark_edges() -> None:
        for edge in edges:
            await asyncio.sleep(max(0.0, t0 + edge - time.monotonic()))
            marks.append((edge, await asyncio.to_thread(evictions)))

    sampler = asyncio.create_task(sample_rss())
    marker = asyncio.create_task(mark_edges()) if evictions is not None else None
    tasks: set[asyncio.Task] = set()
    next_t = t0
    try:
        while True:
            next_t += rng.expovariate(args.request_rate)
            if next_t >= t0 + duration_s:
                break
            await asyncio.sleep(max(0.0, next_t - time.monotonic()))
            # Every request has the backend's deadline, so a free seat comes within it.
            slot = await asyncio.wait_for(free.get(), args.timeout + 60)
            next_t = max(next_t, time.monotonic())  # NOTE: a late arrival must not cause a burst after it
            task = asyncio.create_task(one(slot))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait_for(asyncio.gather(*tasks), args.timeout + 60)
        rss_series.append((round(time.monotonic() - t0, 1),
                           {n: v for n, pid in processes.items() if (v := rss_mb(pid)) is not None}))
        if marker is not None:
            await asyncio.wait_for(marker, 120)  # NOTE: its last edge is the end of the traffic
    finally:
        sampler.cancel()
        if marker is not None:
            marker.cancel()
        for t in tasks:
            t.cancel()
    return results


def window_edges(duration_s: float, warmup: float, windows: int) -> list[float]:
    """0, the end of the warm-up, then `windows` equal windows to the end: [0, w, w + d, ..., duration]."""
    warm = warmup * duration_s
    return [0.0, warm] + [warm + (duration_s - warm) * (k + 1) / windows for k in range(windows)]


def windows_of(results: list[dict], marks: list) -> list[dict]:
    """Per window between two marks (t, {"master": n, "pdorch": n}): the requests that started in it
    (answered ones), their hit rate against their page-aligned ideal, and the pages each evictor removed."""
    out = []
    for (start, a), (end, b) in itertools.pairwise(marks):
        w = [r for r in results if start <= r["start_s"] < end and r["error"] is None]
        prompt = sum(r["prompt_tokens"] for r in w)
        cached, ideal = sum(r["cached_tokens"] for r in w), sum(r["ideal_tokens"] for r in w)
        out.append({"start_s": round(start, 1), "end_s": round(end, 1), "warmup": start == 0.0, "requests": len(w),
                    "hit_rate": round(cached / prompt, 4) if prompt else None,
                    "ideal_hit_rate": round(ideal / prompt, 4) if prompt else None,
                    "hit_over_ideal": round(cached / ideal, 4) if ideal else None,
                    **{f"{k}_evicted": (b[k] - a[k] if a.get(k) is not None and b.get(k) is not None else None)
                       for k in ("master", "pdorch")}})
    return out


def summarize(args, results: list[dict], duration_s: float, marks: list | None = None) -> dict:
    warm_s = args.warmup * duration_s
    steady = [r for r in results if r["start_s"] >= warm_s and r["error"] is None]
    errors: dict[str, int] = {}
    for r in results:
        if r["error"] is not None:
            kind = r["error"].split(":")[0]
            errors[kind] = errors.get(kind, 0) + 1
    prompt = sum(r["prompt_tokens"] for r in steady)
    ttfts = [r["ttft_s"] for r in steady if r["ttft_s"] is not None]
    e2e = [r["e2e_s"] for r in steady]
    windows = windows_of(results, marks or [])
    after = [w for w in windows if not w["warmup"]]
    ratios = [w["hit_over_ideal"] for w in after if w["hit_over_ideal"] is not None]
    master = [w["master_evicted"] for w in windows]
    pdorch = [w["pdorch_evicted"] for w in windows]
    counted = None not in master and None not in pdorch and windows
    return {"requests": len(results), "errors": sum(errors.values()), "error_kinds": errors,
            "windows": windows, "hit_rate_by_window": [w["hit_rate"] for w in windows],
            "hit_over_ideal_by_window": [w["hit_over_ideal"] for w in windows],
            "worst_hit_over_ideal_after_warmup": min(ratios) if ratios else None,
            "master_evicted_pages": sum(master) if counted else None,
            "pdorch_evicted_pages": sum(pdorch) if counted else None,
            "master_eviction_share": (round(sum(master) / (sum(master) + sum(pdorch)), 4)
                                      if counted and sum(master) + sum(pdorch) else (0.0 if counted else None)),
            "achieved_rate": round(len(results) / duration_s, 4),
            "hit_rate": round(sum(r["cached_tokens"] for r in steady) / prompt, 4) if prompt else None,
            "ideal_hit_rate": round(sum(r["ideal_tokens"] for r in steady) / prompt, 4) if prompt else None,
            "ttft_p50_s": percentile(ttfts, 50), "ttft_p99_s": percentile(ttfts, 99),
            "e2e_p50_s": percentile(e2e, 50), "e2e_p99_s": percentile(e2e, 99),
            "first_errors": [r["error"] for r in results if r["error"] is not None][:5]}


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    say = rep.sayer(args.json)
    t_start = time.monotonic()
    cluster, sets = rep.start_cluster(args, SOAK_SETS, "pdorch bench soak", say)
    cfg = cluster.cfg
    addresses = rep.worker_addresses(cfg, 1, 1)
    worker_metrics, master_metrics = metrics_urls(cfg, 1, 1)
    duration = args.minutes * 60
    rss_series: list = []
    try:
        tok, _, _, page, name = model_facts(None, cfg)
        turns = TurnSource(tok, args.seed)

        def new_conv(slot: Slot) -> Conversation:
            client = slot.index + slot.generation * args.clients  # NOTE: new text (and rid) each generation
            return Conversation(client, args.api, tok, turns, page, args.first_tokens, args.turn_tokens)

        baseline, _ = rep.wait_idle(cfg, addresses)
        backend = HttpBackend(cluster.url, args.api, name, args.output_tokens, args.timeout, args.clients,
                              cfg.router.api_key)
        say(f"soak: {args.minutes:g} min at {args.request_rate:g} req/s, {args.clients} conversations x "
            f"{args.rounds} rounds, turns {args.first_tokens}/{args.turn_tokens}, output {args.output_tokens}")
        def evictions() -> dict:
            master = scrape(master_metrics) if master_metrics else None
            workers = [scrape(u) for u in worker_metrics]
            return {"master": total(master, "master_evicted_key_count") if master else None,
                    "pdorch": None if None in workers else sum(total(s, "pdorch_store_evicted_pages_total")
                                                               for s in workers)}

        marks: list = []
        try:
            results = asyncio.run(drive(args, backend, new_conv, duration, rss_series, cluster.processes(),
                                        window_edges(duration, args.warmup, args.windows), evictions, marks))
        finally:
            asyncio.run(backend.close())
        end_states, idle_s = rep.wait_idle(cfg, addresses)
        at_end = evictions()
        evicted = None if at_end["master"] is None else int(at_end["master"])
        chain_evicted = None if at_end["pdorch"] is None else int(at_end["pdorch"])
    finally:
        cluster.stop()
    traffic_end = max((t for t, _ in rss_series), default=duration)
    window = max(args.rss_interval * 2.5, 0.05 * duration)
    drift = rep.rss_drift(rss_series, args.warmup * duration, min(traffic_end, duration), window)
    leaked = rep.leaked_pages(baseline, end_states)
    out = summarize(args, results, duration, marks)
    # NOTE: the verdict is on growth (a leak); memory given back shows in rss_max_drift and min_over_warm.
    out.update(rss_mb=drift, rss_max_drift=max((abs(d["end_over_warm"] - 1) for d in drift.values()), default=None),
               rss_max_growth=max((d["max_growth"] for d in drift.values()), default=None),
               leaked_pages=sum(v for v in leaked.values() if v is not None) if None not in leaked.values() else None,
               leaked_by_worker=leaked, pools_end=end_states, pools_baseline=baseline, idle_wait_s=round(idle_s, 1),
               integrity_ok=all(s.get("integrity_ok") for s in end_states.values()),
               store_pages_evicted=evicted, store_chain_evicted_pages=chain_evicted)
    out["pass"] = bool(out["errors"] == 0 and out["leaked_pages"] == 0 and out["integrity_ok"]
                       and out["rss_max_growth"] is not None and out["rss_max_growth"] <= MAX_GROWTH
                       and out["worst_hit_over_ideal_after_warmup"] is not None
                       and out["worst_hit_over_ideal_after_warmup"] >= MIN_HIT_OVER_IDEAL
                       and out["master_eviction_share"] is not None
                       and out["master_eviction_share"] <= MAX_MASTER_EVICTION_SHARE)
    title = (f"pdorch bench soak: {args.minutes:g} min at {args.request_rate:g} req/s, {out['requests']} requests, "
             f"{out['errors']} errors, leaked {out['leaked_pages']} ({commit()})")
    plot_path = Path(args.plot) if args.plot else Path(tempfile.mkdtemp(prefix="pdorch-soak-")) / "soak_rss.png"
    plot = rep.plot_rss(rss_series, args.warmup * duration, drift, title, plot_path)
    print(f"\n{title}")
    print(f"{'process':<12} {'warm MiB':>9} {'end MiB':>9} {'end/warm':>9} {'max growth':>11} {'min/warm':>9}")
    for n, d in drift.items():
        print(f"{n:<12} {d['warm_mb']:>9.1f} {d['end_mb']:>9.1f} {d['end_over_warm']:>9.3f} {d['max_growth']:>11.3f}"
              f" {d['min_over_warm']:>9.3f}")
    print(f"requests {out['requests']} (achieved {out['achieved_rate']} req/s), errors {out['errors']} "
          f"{out['error_kinds'] or ''}, hit rate after warm-up {out['hit_rate']} (ideal {out['ideal_hit_rate']}), "
          f"TTFT p50/p99 {out['ttft_p50_s']}/{out['ttft_p99_s']} s")
    print(rep.window_table(out["windows"]))
    print(f"worst window hit / ideal after warm-up {out['worst_hit_over_ideal_after_warmup']} (>= "
          f"{MIN_HIT_OVER_IDEAL}); mooncake_master's share of the store's evictions {out['master_eviction_share']} "
          f"(<= {MAX_MASTER_EVICTION_SHARE})")
    print(f"leaked pages {out['leaked_pages']} {leaked}, integrity {out['integrity_ok']}, idle after "
          f"{out['idle_wait_s']} s; store evicted by the master {evicted}, by the workers' chain evictor {chain_evicted}; pass {out['pass']}")
    print(f"plot: {plot}")
    if args.json:
        out.update(bench="soak", minutes=args.minutes, request_rate=args.request_rate, clients=args.clients,
                   rounds=args.rounds, first_tokens=args.first_tokens, turn_tokens=args.turn_tokens,
                   output_tokens=args.output_tokens, api=args.api, sets=sets, commit=commit(), plot=plot,
                   elapsed_s=round(time.monotonic() - t_start, 1), rss_series=rss_series)
        print(json.dumps(out))
    return 0

