"""Replay a production trace against pdorch: hit rate against the instant and the causal ideal,
TTFT / ITL percentiles, goodput under SLOs, prompt tokens by tier, errors; a table, a per-minute PNG,
and with --json one JSON line.

    pdorch bench trace TRACE.jsonl [--format auto] [--block-tokens 16] [--speedup 1] [--json]
    pdorch bench trace TRACE.jsonl --compare-inflight     the same trace on two fresh clusters: in-flight
                                                          prefix sharing (prefill and decode) off, then on
    pdorch bench trace generate OUT.jsonl [...]           write a synthetic trace (bench/trace/generate.py)
    python -m bench.trace ...                             (the same)

Formats: Mooncake FAST'25 (and aiperf's mooncake_trace), Alibaba Bailian, aiperf single_turn and
multi_turn (bench/trace/formats.py). Starts its own cluster with `pdorch serve` (--prefill, --decode,
--config, --set), or replays against a running router with --url.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from bench.multiturn.cluster import bench_config
from bench.multiturn.facts import commit, model_facts
from bench.multiturn.stats import rounded
from bench.trace import generate, report
from bench.trace.formats import BLOCK_SIZES, FORMATS, read_trace
from bench.trace.plan import PlanOptions, plan
from bench.trace.request import TraceError
from bench.trace.run import RunSpec, replay_once
from bench.trace.tokens import BlockTokens, ordinary_vocabulary
from pdorch.config_loader import add_config_args
from pdorch.local_stack.hf_checkpoints import FAMILIES

# in-flight prefix sharing: on prefill workers and on decode workers (one switch each)
INFLIGHT_KEYS = ("prefill.share_inflight_prefix", "decode.share_inflight_prefix")
INFLIGHT_RUNS = (RunSpec("inflight off", tuple(f"{k}=false" for k in INFLIGHT_KEYS)),
                 RunSpec("inflight on", tuple(f"{k}=true" for k in INFLIGHT_KEYS)))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pdorch bench trace", description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("trace", help="the JSONL trace file ('generate' instead writes one: pdorch bench trace generate -h)")
    p.add_argument("--format", choices=FORMATS, default="auto", help="the trace's format (default: from its fields)")
    p.add_argument("--block-tokens", type=int, default=16,
                   help="tokens each hash block becomes (default 16: a block is a page at page_size 16)")
    p.add_argument("--trace-block-size", type=int,
                   help="tokens per hash block as recorded (default: mooncake 512, bailian 16): scales a "
                        "partial last block and a prompt recorded without hash ids")
    p.add_argument("--speedup", type=float, default=1.0, help="time compression: arrivals and delays / this")
    p.add_argument("--sessions-fraction", type=float, default=1.0,
                   help="keep this fraction of the sessions, whole (chosen by --seed)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-scale", type=float, default=1.0, help="output lengths x this (at least 1 token)")
    p.add_argument("--default-output-tokens", type=int, default=32, help="output length where the trace has none")
    p.add_argument("--max-requests", type=int, help="replay only the first N requests due")
    p.add_argument("--duration-s", type=float, help="replay only requests due within this many seconds")
    p.add_argument("--slo-ttft", type=float, default=2.0, help="goodput: TTFT at most this (s, default 2)")
    p.add_argument("--slo-itl", type=float, default=0.2, help="goodput: mean ITL at most this (s, default 0.2)")
    p.add_argument("--prefill", type=int, default=1, help="prefill workers of the cluster")
    p.add_argument("--decode", type=int, default=1, help="decode workers of the cluster")
    p.add_argument("--url", help="replay against a running router instead of starting a cluster")
    p.add_argument("--compare-inflight", action="store_true",
                   help=f"run twice on fresh clusters: {' and '.join(INFLIGHT_KEYS)} false, then true")
    p.add_argument("--timeout", type=float, default=600.0, help="deadline of one request (s)")
    p.add_argument("--bin-s", type=float, default=60.0, help="the per-bin rates and the plot's bins (s)")
    p.add_argument("--plot-dir", help="where the PNG goes (default: a new temp dir)")
    p.add_argument("--label", help="plot file name (default: the trace file's name)")
    p.add_argument("--log-dir", help="component logs of the started clusters (default: temp dirs)")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.add_argument("--test-model", choices=FAMILIES, help="serve a random-weights checkpoint of this family "
                   "(pdorch/local_stack/hf_checkpoints.py) instead of model.source")
    add_config_args(p)
    return p


def check(p: argparse.ArgumentParser, args) -> None:
    for name, value, ok, need in (
            ("--block-tokens", args.block_tokens, args.block_tokens >= 1, ">= 1"),
            ("--trace-block-size", args.trace_block_size, args.trace_block_size is None or args.trace_block_size >= 1,
             ">= 1"),
            ("--speedup", args.speedup, args.speedup > 0, "> 0"),
            ("--sessions-fraction", args.sessions_fraction, 0 < args.sessions_fraction <= 1, "in (0, 1]"),
            ("--output-scale", args.output_scale, args.output_scale > 0, "> 0"),
            ("--default-output-tokens", args.default_output_tokens, args.default_output_tokens >= 1, ">= 1"),
            ("--max-requests", args.max_requests, args.max_requests is None or args.max_requests >= 1, ">= 1"),
            ("--duration-s", args.duration_s, args.duration_s is None or args.duration_s > 0, "> 0"),
            ("--timeout", args.timeout, args.timeout > 0, "> 0"), ("--bin-s", args.bin_s, args.bin_s > 0, "> 0")):
        if not ok:
            p.error(f"{name} must be {need}, got {value}")
    if args.url and args.compare_inflight:
        p.error("--compare-inflight starts its own clusters: not with --url")
    taken = [k for k in INFLIGHT_KEYS if any(s.startswith(k + "=") for s in args.config_overrides)]
    if args.compare_inflight and taken:
        p.error(f"--compare-inflight sets {taken[0]} itself: not with --set {taken[0]}=...")


def prompts(planned, fmt: str, args, tokenizer) -> tuple[list, list]:
    """(whole prompt ids or None for a history-carrying turn, the request's own ids) of every request."""
    blocks = BlockTokens(args.block_tokens, *ordinary_vocabulary(tokenizer))
    recorded = args.trace_block_size or BLOCK_SIZES.get(fmt, 512)
    whole, own = [], []
    for item in planned:
        r = item.req
        ids = tokenizer.encode(r.text, add_special_tokens=False) if r.text is not None else blocks.prompt(r, recorded)
        whole.append(None if r.carries_history else ids)
        own.append(ids)
    return whole, own


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["generate"]:
        return generate.main(argv[1:])
    p = parser()
    args = p.parse_args(argv)
    check(p, args)
    say = (lambda m: print(m, file=sys.stderr, flush=True)) if args.json else (lambda m: print(m, flush=True))
    cfg = bench_config(args, "pdorch bench trace")
    t0 = time.monotonic()
    try:
        fmt, requests = read_trace(args.trace, args.format)
    except (TraceError, OSError) as e:
        p.error(str(e))
    opts = PlanOptions(speedup=args.speedup, sessions_fraction=args.sessions_fraction, seed=args.seed,
                       output_scale=args.output_scale, default_output_tokens=args.default_output_tokens,
                       duration_s=args.duration_s, max_requests=args.max_requests)
    planned = plan(requests, opts)
    if not planned:
        p.error(f"{args.trace}: no request left after --sessions-fraction / --duration-s / --max-requests")
    tokenizer, _, _, page_size, model = model_facts(args.url, cfg)
    whole, own = prompts(planned, fmt, args, tokenizer)
    sessions = len({x.req.session for x in planned})
    say(f"{args.trace}: {fmt}, {len(requests)} requests; replaying {len(planned)} requests of {sessions} sessions over "
        f"{max(x.estimate_s for x in planned):.1f} s (speedup {args.speedup:g}), page size {page_size}")
    specs = INFLIGHT_RUNS if args.compare_inflight else (RunSpec("replay", ()),)
    runs = [replay_once(spec, args, planned, whole, own, model, page_size, say) for spec in specs]
    label = args.label or Path(args.trace).stem
    title = (f"pdorch bench trace {Path(args.trace).name}: {len(planned)} requests, block {args.block_tokens} tokens, "
             f"speedup {args.speedup:g} ({commit()})")
    from bench.trace.plots import plot_bins
    plot = plot_bins(runs, title, Path(args.plot_dir or tempfile.mkdtemp(prefix="pdorch-trace-")) / f"trace_{label}.png")
    print(f"\n{title}\n{report.runs_table(runs)}\n")
    for run in runs:
        print(report.bins_table(run) + "\n")
    print(f"plot: {plot}")
    if args.json:
        print(json.dumps(rounded({
            "bench": "trace", "trace": str(args.trace), "format": fmt, "trace_requests": len(requests),
            "planned_requests": len(planned), "sessions": sessions, "block_tokens": args.block_tokens,
            "speedup": args.speedup, "sessions_fraction": args.sessions_fraction, "seed": args.seed,
            "output_scale": args.output_scale, "page_size": page_size, "prefill": args.prefill,
            "decode": args.decode, "runs": runs, "plot": str(plot), "commit": commit(),
            "elapsed_s": time.monotonic() - t0})))
    return 0 if all(r["errors"] == 0 for r in runs) else 1
