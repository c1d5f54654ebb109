"""One measured run of `pdorch bench multiturn` against one target:

    cluster   `pdorch serve` started with the preset's and the user's --set flags (or a running
              router with --url), HTTP backend; counters and RSS scraped at each round's end
    engine    the single-process engine.LLM (variant d of --compare), in this process

Returns the per-round JSON objects (bench/multiturn/stats.py) plus what the capacity-bound ideal
was computed from, and an RSS time series for the plot.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time

import httpx

from bench.multiturn import metrics
from bench.multiturn.client import HttpBackend
from bench.multiturn.conversation import Conversation
from bench.multiturn.driver import RoundLoop
from bench.multiturn.presets import Workload, default_high_watermark
from bench.multiturn.stats import summarize_round, usable_capacity_pages
from bench.multiturn.text import TurnSource

RSS_SAMPLE_S = 1.0
QUIET_TIMEOUT_S = 120.0


@dataclasses.dataclass
class Target:
    """Where requests go and what to watch: a router URL (+ metrics) or the in-process engine."""

    url: str = ""
    urls: list = dataclasses.field(default_factory=list)  # router replicas: requests go round-robin
    model: str = ""
    api_key: str = ""
    admin_key: str = ""
    worker_metrics: list = dataclasses.field(default_factory=list)
    master_metrics: str | None = None
    processes: dict = dataclasses.field(default_factory=dict)  # name -> pid, for RSS
    engine: object = None                                       # EngineBackend for variant d
    l1_pages: int | None = None                                 # engine: its pool
    ssd_tier: bool = False                                      # store.ssd_path set: disk under the DRAM


def _scrape_all(target: Target) -> tuple[dict, list | None, list]:
    worker = [metrics.scrape(u) for u in target.worker_metrics]
    master = metrics.scrape(target.master_metrics) if target.master_metrics else None
    return metrics.counters(worker, master), master, worker


def _high_watermark(target: Target) -> float:
    """From the launched master's command line; the launcher's default otherwise."""
    pid = target.processes.get("master")
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            for arg in f.read().decode(errors="replace").split("\0"):
                if arg.startswith("--eviction_high_watermark_ratio="):
                    return float(arg.split("=", 1)[1])
    except (OSError, TypeError, ValueError):
        pass
    return default_high_watermark()


def _rss(target: Target) -> dict:
    out = {name: metrics.rss_mb(pid) for name, pid in target.processes.items()}
    return {k: round(v, 1) for k, v in out.items() if v is not None}


def wait_quiet(target: Target) -> None:
    """Until no prefill page is referenced and no store I/O is queued (write-backs done)."""
    deadline = time.monotonic() + QUIET_TIMEOUT_S
    while time.monotonic() < deadline:
        samples = [s for u in target.worker_metrics for s in (metrics.scrape(u) or [])]
        busy = metrics.total(samples, "pdorch_prefill_pool_used_pages") + metrics.total(
            samples, "pdorch_store_queue_depth")
        if busy == 0:
            return
        time.sleep(0.2)
    print(f"warning: workers still busy after {QUIET_TIMEOUT_S:.0f} s; flushing anyway", file=sys.stderr)


def flush_l1(target: Target) -> None:
    wait_quiet(target)
    headers = {"Authorization": f"Bearer {target.admin_key}"} if target.admin_key else {}
    r = httpx.post(target.url + "/flush_cache", headers=headers, timeout=60)
    if r.status_code != 200:
        print(f"warning: /flush_cache answered {r.status_code}: {r.text[:200]}", file=sys.stderr)


async def run_workload(target: Target, w: Workload, tokenizer, page_size: int, page_nbytes: int, opts,
                       progress=None) -> dict:
    """Run every round; returns {"rounds", "usable_pages", "store_capacity_bytes", ...}."""
    counters0, master, worker = await asyncio.to_thread(_scrape_all, target)
    capacity = metrics.store_capacity(master) or 0
    if target.ssd_tier:  # the SSD tier's capacity counts too (Mooncake reports 2 TiB when unset)
        capacity += metrics.store_file_capacity(master)
    watermark = _high_watermark(target)
    if target.l1_pages is not None:
        l1 = target.l1_pages
    else:
        l1 = int(sum(metrics.total(s or [], "pdorch_prefill_pool_total_pages") for s in worker))
    usable = usable_capacity_pages(capacity, watermark, page_nbytes, l1)
    split = (usable_capacity_pages(capacity, watermark, page_nbytes, 0), l1, page_size)
    turns = TurnSource(tokenizer, opts.seed, opts.random_ids)
    convs = [Conversation(c, w.api, tokenizer, turns, page_size, w.first_tokens, w.turn_tokens)
             for c in range(w.clients)]
    if target.engine is not None:
        backend = target.engine
    else:
        backend = HttpBackend(target.urls or [target.url], w.api, target.model, w.output_tokens, opts.timeout,
                              w.max_parallel or w.clients, target.api_key)
    snapshots = {-1: counters0}
    rss_at_end: dict[int, dict] = {}
    end_times: dict[int, float] = {}
    rss_series: list[tuple[float, dict]] = []
    t0 = time.perf_counter()

    async def on_round_end(r: int, results) -> None:
        end_times[r] = time.perf_counter() - t0
        if opts.round_barrier and target.engine is None:
            # NOTE: a round's write-backs finish after its last answer; count them in that round.
            await asyncio.to_thread(wait_quiet, target)
        snapshots[r] = (await asyncio.to_thread(_scrape_all, target))[0]
        rss_at_end[r] = _rss(target)
        rss_series.append((round(end_times[r], 2), rss_at_end[r]))
        if opts.flush_l1_between_rounds and target.engine is None and r + 1 < w.rounds:
            await asyncio.to_thread(flush_l1, target)

    async def sample_rss() -> None:
        while True:
            rss_series.append((round(time.perf_counter() - t0, 2), _rss(target)))
            await asyncio.sleep(RSS_SAMPLE_S)

    loop = RoundLoop(convs, backend, w.rounds, w.max_parallel or w.clients, opts.request_rate,
                     opts.round_barrier, opts.seed, on_round_end, progress, stall_timeout_s=opts.timeout + 300)
    sampler = asyncio.create_task(sample_rss())
    try:
        results = await loop.run()
    finally:
        sampler.cancel()
        await backend.close()
    rounds = []
    for r in range(w.rounds):
        d = metrics.delta(snapshots[r - 1], snapshots[r]) or {}
        counts = {k: (int(v) if isinstance(v, float) else v) for k, v in d.items()}
        counts["reads"] = metrics.pages_by_tier(d.get("reads") or {}, page_size)
        for k in ("store_save_dropped_pages", "store_save_failed_pages", "store_load_miss_pages"):
            counts[k] = {reason: int(n) for reason, n in (d.get(k) or {}).items() if n}
        span = loop.round_span.get(r, [0.0, 0.0])
        row = summarize_round(r, results[r], usable, span[1] - span[0], counts, d.get("tiers") or None,
                              rss_at_end.get(r), capacity=split)
        row["store_save_failed_pages"] = counts["store_save_failed_pages"]
        row["end_s"] = round(end_times.get(r, 0.0), 2)
        rounds.append(row)
    return {"rounds": rounds, "usable_pages": usable, "store_capacity_bytes": capacity,
            "eviction_high_watermark": watermark, "l1_pages": l1, "page_bytes": page_nbytes,
            "prompt_token_mismatches": loop.prompt_mismatches, "rss_series": rss_series}
