"""Where the router's added TTFT goes: ours against the control (floor.py), step by step.

The comparison (compare.py) measures the added TTFT from the client; this runs its latency phase
(64 streams, 16 tokens, a token every 40 ms, random arrival phases) with both routers started
through ttft_tracer.py and reports, per step of a request's path to its first token
(connection accepted -> head parsed -> task -> Generate begun -> on the wire -> first token read
-> task resumed -> first event written), the p50 / p90 in µs for ours and for the floor, and for
ours the handler's own steps (parse, admission, hashing, the choice). Targets alternate in short
runs, each followed by a direct run for the added TTFT of that pair (traced: a few µs per step
more than untraced, alike for both).

    python -m bench.router_overhead ttft-path [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

from bench.router_overhead.load_client import closed_loop, pct
from bench.router_overhead.targets import Procs, start_targets
from bench.router_overhead.ttft_tracer import STEPS
from engine.prepare import make_tiny_model

TRACER = "bench.router_overhead.ttft_tracer"
CONCURRENCY, TOKENS, TOKEN_DELAY_S = 64, 16, 0.04


def step_table(records: list[dict]) -> dict[str, dict[str, float]]:
    """Per step (`a->b` between consecutive STEPS, and `head->write` in all): p50 and p90 in µs."""
    table = {}
    for a, b in [*itertools.pairwise(STEPS), ("head", "write")]:
        spans_us = [(r[b] - r[a]) * 1e6 for r in records]
        table[f"{a}->{b}"] = {"p50": pct(spans_us, 0.5), "p90": pct(spans_us, 0.9)}
    return table


def handler_table(records: list[dict]) -> dict[str, float]:
    """Per timed handler step (`us:` keys): the p50 µs per request (0 where a request skipped it)."""
    keys = sorted({k for r in records for k in r if k.startswith("us:")})
    return {k[3:]: pct([r.get(k, 0.0) for r in records], 0.5) for k in keys}


def _traced_start(procs: Procs):
    start = procs.start

    def traced(name: str, args: list[str]):
        if name == "pdorch_router":  # [py, -m, router, ...]
            args = [args[0], "-m", TRACER, "ours", *args[1:]]
        elif name == "python_floor":  # [py, -m, bench.router_overhead.floor, ...]
            args = [args[0], "-m", TRACER, "floor", *args[1:]]
        return start(name, args)

    return traced


def run(repeats: int, warmup_s: float, duration_s: float) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="router_ttft_path_"))
    os.environ["TTFT_TRACE_DIR"] = str(tmp)  # the children inherit it
    procs = Procs(tmp)
    procs.start = _traced_start(procs)
    records: dict[str, list[dict]] = {"ours": [], "floor": []}
    added: dict[str, list[float]] = {"ours": [], "floor": []}
    try:
        urls = start_targets(procs, tmp, TOKEN_DELAY_S, make_tiny_model(tmp / "model"), floor=True)

        def load(url: str) -> dict:
            return asyncio.run(closed_loop(url, CONCURRENCY, TOKENS, warmup_s, duration_s, False, TOKEN_DELAY_S,
                                           "lean", TOKEN_DELAY_S))

        for _ in range(repeats):
            for key in ("ours", "floor"):
                res, direct = load(urls[key]), load(urls["ours_direct"])
                added[key].append(res["ttft_p50_ms"] - direct["ttft_p50_ms"])
                dump = tmp / f"{key}.json"
                dump.unlink(missing_ok=True)
                os.kill(urls["pids"][key], signal.SIGUSR1)
                deadline = time.monotonic() + 10
                while not dump.exists():
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{key}: no trace dump in {dump} 10 s after SIGUSR1")
                    time.sleep(0.05)
                records[key] += json.loads(dump.read_text())
    finally:
        procs.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return {key: {"added_ttft_p50_ms": [round(a, 3) for a in added[key]], "requests": len(records[key]),
                  "steps_us": step_table(records[key]),
                  **({"handler_us_p50": handler_table(records[key])} if key == "ours" else {})}
            for key in records}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.router_overhead ttft-path",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="alternating runs per router")
    ap.add_argument("--warmup-s", type=float, default=1.0)
    ap.add_argument("--duration-s", type=float, default=5.0)
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = ap.parse_args(argv)
    out = run(args.repeats, args.warmup_s, args.duration_s)
    for key, res in out.items():
        print(f"{key}: added TTFT p50 {res['added_ttft_p50_ms']} ms, {res['requests']} requests traced")
        for step, v in res["steps_us"].items():
            print(f"  {step:14s} p50 {v['p50']:8.1f} µs   p90 {v['p90']:8.1f} µs")
        for step, us in res.get("handler_us_p50", {}).items():
            print(f"    handler {step:30s} p50 {us:6.1f} µs")
    if args.json:
        print(json.dumps(out))
    return 0

