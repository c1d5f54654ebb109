"""Sustained multi-turn load: N clients x R rounds, each round a client sends its whole conversation
so far (previous prompt + previous answer + a new user turn). Per round: TTFT, ITL, tokens/s, hit
rate against the page-aligned and the capacity-bound ideal, tokens by tier, store pages read /
written / evicted, RSS of every process; a table, a PNG, and with --json one JSON line.

    python -m bench.multiturn [--preset fits|l3|full|none] [--api sglang|openai] [--json]
    pdorch bench multiturn ...                  (the same)
    python -m bench.multiturn --compare         (a) store + offload, (b) store off, (c) offload
                                                off, (d) single-process engine.LLM, (e) as (a) but
                                                store -> decode loading, conditional disaggregation
                                                and store-aware routing off, (f) as (a) but the
                                                decode worker's prefix cache off; same workload
    python -m bench.multiturn --preset ssd --compare   (a) DRAM + SSD, (g) DRAM only, (b) store off
    python -m bench.multiturn --routers 3 [--compare]  3 router replicas, requests spread over them
                                                round-robin (a Kubernetes Service); --compare: (r1) one
                                                router, (rn) N routers on KV events, (rg) N routers
                                                on the guess-based index (router.kv_events=false)
    python -m bench.multiturn --sweep [--shapes A,B]   a grid of cache shapes (bench/multiturn/sweep.py):
                                                per shape the worst hit / free-L1 capacity-bound ideal

Starts its own cluster with `pdorch serve` (the preset's sizes, then --config / --set), or loads
a running router with --url (counters then come from the config's metrics ports).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.multiturn import report
from bench.multiturn.cluster import ServeCluster, bench_config, effective_config, metrics_urls, port_overrides
from bench.multiturn.facts import commit, model_facts
from bench.multiturn.presets import (
    PRESET_WORKLOADS,
    PRESETS,
    Workload,
    describe,
    page_bytes,
    preset_overrides,
)
from bench.multiturn.run import Target, run_workload
from bench.multiturn.stats import rounded, run_summary
from pdorch.config_loader import add_config_args
from pdorch.launch_plan import torch_threads_per_worker
from pdorch.local_stack.hf_checkpoints import FAMILIES

VARIANTS = {"a": ("store + offload", []), "b": ("store off", ["store.enabled=false"]),
            "c": ("offload off", ["decode.offload_generated_kv=false"]), "d": ("engine.LLM", []),
            # store -> decode, conditional disaggregation and store-aware routing off (a has them on)
            "e": ("beyond-anchors off", ["decode.load_prefix_from_store=false", "decode.max_local_prefill_tokens=0",
                                         "router.store_aware_routing=false"]),
            "f": ("decode prefix cache off", ["decode.prefix_cache=false"]),
            # --preset ssd: the same store without its SSD tier (a: DRAM + SSD, b: store off)
            "g": ("DRAM only", ["store.ssd_path="]),
            # --routers N --compare: the same cluster behind 1 router, N routers, N routers without KV events
            "r1": ("1 router", []), "rn": ("N routers, KV events", []),
            "rg": ("N routers, guess-based index", ["router.kv_events=false"])}
SSD_VARIANTS = ("a", "g", "b")  # what --preset ssd --compare runs
ROUTER_VARIANTS = ("r1", "rn", "rg")  # what --routers N --compare runs


def routers_of(key: str, args) -> int:
    """Router replicas of a variant: r1 one, the others --routers."""
    return 1 if key == "r1" else args.routers


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pdorch bench multiturn", description=__doc__.split("\n")[0],
                                allow_abbrev=False)
    p.add_argument("--api", choices=["sglang", "openai"], default="sglang",
                   help="sglang: /generate with input_ids; openai: /v1/chat/completions, conversation as text")
    # NOTE: default None: the preset's workload (PRESET_WORKLOADS) fills what is not given.
    p.add_argument("--clients", type=int, help="conversations (default: the preset's, 8 or 16)")
    p.add_argument("--rounds", type=int, help="turns per conversation (default 6)")
    p.add_argument("--first-tokens", type=int, help="tokens of each client's first turn (default: the preset's)")
    p.add_argument("--turn-tokens", type=int, help="tokens of each later user turn (default: the preset's)")
    p.add_argument("--output-tokens", type=int, help="tokens generated per answer (default: the preset's)")
    p.add_argument("--max-parallel", type=int, default=0, help="requests in flight at most (0 = --clients)")
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="Poisson arrivals per second (default: send each as soon as it is ready)")
    p.add_argument("--round-barrier", action=argparse.BooleanOptionalAction, default=True,
                   help="start round r only when every round r-1 answer is in (default on)")
    p.add_argument("--flush-l1-between-rounds", action="store_true",
                   help="after each round wait for write-backs, then flush every worker's L1 (/flush_cache)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--random-ids", action="store_true", help="random token ids instead of English-like text")
    p.add_argument("--preset", choices=PRESETS, default="l3", help="cluster sizes (see bench/multiturn/presets.py)")
    p.add_argument("--prefill", type=int, default=1, help="prefill workers of the cluster")
    p.add_argument("--decode", type=int, default=1, help="decode workers of the cluster")
    p.add_argument("--routers", type=int, default=1, help="router replicas (pdorch serve --routers); requests "
                   "go to them round-robin, as a Kubernetes Service spreads connections")
    p.add_argument("--url", help="load a running router instead of starting a cluster")
    p.add_argument("--compare", action="store_true", help="run variants a-e on the same workload")
    p.add_argument("--variants", help="with --compare: only these, comma-separated (e.g. a,e)")
    p.add_argument("--sweep", action="store_true", help="run every cache shape of bench/multiturn/sweep.py "
                   "(each sets its own workload and sizes; --rounds, --api and --set still apply)")
    p.add_argument("--shapes", help="with --sweep: only these shapes, comma-separated")
    p.add_argument("--timeout", type=float, default=600.0, help="deadline of one request (s)")
    p.add_argument("--plot-dir", help="where the PNG goes (default: a new temp dir)")
    p.add_argument("--label", help="plot file name and title (default: PRESET_API[_compare])")
    p.add_argument("--log-dir", help="component logs of the started clusters (default: temp dirs)")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.add_argument("--test-model", choices=FAMILIES, help="serve a random-weights checkpoint of this family "
                   "(pdorch/local_stack/hf_checkpoints.py, built once into ~/.cache/pdorch/test-models) instead of model.source")
    add_config_args(p)
    return p


def run_variant(key: str, args, w: Workload, facts, say, sized=None) -> dict:
    """One measured run. `sized(w, cfg, kv_values_per_token)`: the sizing --set flags (the sweep's
    shapes), instead of the preset's."""
    from tqdm import tqdm
    tok, model_dir, kv_per_token, page, name = facts
    extra = VARIANTS[key][1] if args.compare else []
    base = effective_config(args.config, extra + args.config_overrides)
    routers = routers_of(key, args)
    preset = "none" if args.url else args.preset  # NOTE: a running cluster keeps its sizes
    ssd_dir = tempfile.mkdtemp(prefix="pdorch-multiturn-ssd-") if preset == "ssd" else ""
    sets = (sized(w, base, kv_per_token) if sized else
            preset_overrides(preset, w, base, kv_per_token, args.prefill, args.decode, ssd_dir)) + extra
    sets += args.config_overrides
    cfg = effective_config(args.config, sets)
    nbytes = page_bytes(cfg, kv_per_token)
    if preset != "none" and sized is None:
        say(describe(preset, w, cfg, kv_per_token))
    say(f"[{key}] {VARIANTS[key][0]}: --set " + " ".join(sets))
    cluster, target = None, Target(model=name, api_key=cfg.router.api_key, admin_key=cfg.router.admin_key,
                                   ssd_tier=bool(cfg.store.enabled and cfg.store.ssd_path))
    try:
        if key == "d":
            from bench.multiturn.engine_backend import EngineBackend
            l1 = cfg.prefill.num_pages * args.prefill + cfg.decode.num_pages  # the KV memory P and D had
            threads = torch_threads_per_worker(cfg, 1)  # the cores P and D shared, or model.torch_threads
            target.engine = EngineBackend(model_dir, l1, page, w.output_tokens, w.api, threads, args.timeout)
            target.l1_pages, target.processes = l1, {"bench (engine)": os.getpid()}
        elif args.url:
            target.url = args.url.rstrip("/")
            target.worker_metrics, target.master_metrics = metrics_urls(cfg, args.prefill, args.decode)
        else:
            sets += port_overrides(args.prefill, args.decode, routers)
            log_dir = f"{args.log_dir}/{key}" if args.log_dir else None
            cluster = ServeCluster(args.config, sets, args.prefill, args.decode, log_dir,
                                   num_routers=routers).start()
            say(f"[{key}] cluster ready at {' '.join(cluster.urls)} (logs in {cluster.log_dir})")
            target.url, target.urls = cluster.url, cluster.urls
            target.worker_metrics, target.master_metrics = metrics_urls(cluster.cfg, args.prefill, args.decode)
            target.processes = cluster.processes()
        with tqdm(total=w.clients * w.rounds, file=sys.stderr, desc=f"[{key}] requests", unit="req") as bar:
            res = asyncio.run(run_workload(target, w, tok, page, nbytes, args, bar))
    finally:
        if cluster is not None:
            cluster.stop()
        if ssd_dir:
            shutil.rmtree(ssd_dir, ignore_errors=True)
    res.update(run_summary(res["rounds"]), variant=key, variant_name=VARIANTS[key][0], sets=sets)
    return res


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    for key, value in PRESET_WORKLOADS.get(args.preset, PRESET_WORKLOADS["l3"]).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.flush_l1_between_rounds and not args.round_barrier:
        p.error("--flush-l1-between-rounds needs the round barrier (a flush mid-round hits requests in flight)")
    say = (lambda m: print(m, file=sys.stderr, flush=True)) if args.json else (lambda m: print(m, flush=True))
    cfg = bench_config(args, "pdorch bench multiturn")
    t0 = time.monotonic()
    facts = model_facts(args.url, cfg)
    w = Workload(args.clients, args.rounds, args.first_tokens, args.turn_tokens, args.output_tokens, args.api,
                 args.max_parallel)
    if args.routers < 1:
        p.error(f"--routers must be >= 1, got {args.routers}")
    if args.routers > 1 and args.url:
        p.error("--routers starts its own cluster: not with --url")
    if args.compare:
        keys = list(ROUTER_VARIANTS if args.routers > 1 else SSD_VARIANTS if args.preset == "ssd"
                    else (k for k in VARIANTS if k not in ROUTER_VARIANTS))
    else:
        keys = ["a"]
    if args.url and args.compare:
        keys = ["a", "d"]  # NOTE: a running cluster cannot be reconfigured into b, c and e
    if args.variants:
        if not args.compare:
            p.error("--variants goes with --compare")
        keys = [k for k in args.variants.split(",") if k]
        unknown = [k for k in keys if k not in VARIANTS]
        if unknown:
            p.error(f"--variants: unknown {','.join(unknown)} (choose from {','.join(VARIANTS)})")
    if args.sweep:
        return sweep(args, p, facts, say, t0)
    variants = {k: run_variant(k, args, w, facts, say) for k in keys}
    label = args.label or f"{args.preset}_{args.api}" + ("_compare" if args.compare else "")
    from bench.multiturn.plots import plot_run
    plot_dir = Path(args.plot_dir or tempfile.mkdtemp(prefix="pdorch-multiturn-"))
    title = (f"pdorch bench multiturn {label}: {w.clients} clients x {w.rounds} rounds, {w.api}, "
             f"turns {w.first_tokens}/{w.turn_tokens}, output {w.output_tokens} ({commit()})")
    plot = plot_run({f"{k} {v['variant_name']}": v for k, v in variants.items()}, title,
                    plot_dir / f"multiturn_{label}.png")
    main_res = variants[keys[0]]
    print(f"\n{title}\n{report.round_table(main_res['rounds'])}\n\n{report.reads_table(main_res['rounds'])}\n\n"
          f"{report.rss_table(main_res['rounds'])}\n\n{report.summary_lines(main_res)}")
    if args.compare:
        print("\n" + report.compare_table(variants))
    print(f"plot: {plot}")
    if args.json:
        out = {k: v for k, v in main_res.items() if k != "rss_series"}
        out.update(bench="multiturn", label=label, preset=args.preset, api=w.api, clients=w.clients,
                   routers=args.routers,
                   rounds_count=w.rounds, first_tokens=w.first_tokens, turn_tokens=w.turn_tokens,
                   output_tokens=w.output_tokens, round_barrier=args.round_barrier, seed=args.seed,
                   commit=commit(), plot=str(plot), elapsed_s=time.monotonic() - t0)
        if args.compare:
            out["compare"] = {k: {"name": v["variant_name"], "worst_hit_over_ideal": v["worst_hit_over_ideal"],
                                  "ttft_last_over_round1": v["ttft_last_over_round1"],
                                  "rounds": [{f: r[f] for f in ("round", "hit_rate", "ideal_hit_rate",
                                                                 "capacity_ideal_hit_rate", "ttft_mean_s",
                                                                 "p2d_bytes_per_request", "prefill_calls_avoided", "tier_tokens")}
                                             for r in v["rounds"]]} for k, v in variants.items()}
        print(json.dumps(rounded(out)))
    return 0


def sweep(args, p, facts, say, t0: float) -> int:
    """--sweep: every shape on a cluster of its own; a per-shape table and one JSON line."""
    from bench.multiturn import sweep as sw
    if args.url or args.compare:
        p.error("--sweep starts its own clusters: not with --url or --compare")
    try:
        shapes = sw.pick(args.shapes)
    except ValueError as e:
        p.error(f"--shapes: {e}")
    rows = []
    for i, shape in enumerate(shapes):
        w = shape.workload(args.rounds, args.api)
        say(f"[sweep {i + 1}/{len(shapes)}] {shape.name}: {w}")
        res = run_variant("a", args, w, facts, say,
                          sized=lambda w, cfg, kv, s=shape: sw.shape_overrides(s, w, cfg, kv))
        rows.append(sw.shape_row(shape, w, res))
        say(sw.sweep_table(rows[-1:]))
    worst = [r["worst_hit_over_free_l1_capacity_ideal"] for r in rows]
    print(f"\npdorch bench multiturn --sweep: {len(rows)} shapes, {args.rounds} rounds, {args.api} ({commit()})")
    print(sw.sweep_table(rows))
    print(f"worst over every shape and round: {min((x for x in worst if x is not None), default=None)}")
    if args.json:
        print(json.dumps(rounded({"bench": "multiturn_sweep", "api": args.api, "rounds_count": args.rounds,
                                  "shapes": rows, "commit": commit(), "elapsed_s": time.monotonic() - t0,
                                  "worst_hit_over_free_l1_capacity_ideal": min(
                                      (x for x in worst if x is not None), default=None)})))
    return 0

