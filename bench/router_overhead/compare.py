"""Router overhead: latency the router adds, and the requests/s it sustains, against a fast stand-in
worker; side by side in one run with SGLang's Rust `sglang-router` (PyPI) routing to an HTTP
stand-in that answers exactly like our gRPC one.

    client --HTTP /generate--> pdorch router --gRPC Generate--> stand-in D (pdorch/local_stack/standin.py)
    client --gRPC Generate------------------------------------> stand-in D          (our baseline)
    client --HTTP /generate--> sglang-router --HTTP /generate--> HTTP stand-in (http_standin.py)
    client --HTTP /generate------------------------------------> HTTP stand-in     (its baseline)
    client --HTTP /generate--> floor.py --gRPC---------------> stand-in D          (the control)

The control (`--no-floor` leaves it out) is the least a Python router does per request: a bare
proxy on the same loop, gRPC client and SSE body as ours, with no routing, metrics or failover.
Its CPU per request, next to sglang-router's in the same run, says how far Python can go here.

Every worker streams `--tokens` synthetic tokens; the client (load_client.py, `--client`)
keeps `--concurrency` streams open (closed loop). Two phases:
  latency     the stand-ins wait `--token-delay-ms` between tokens (like a decode step), so the
              routers are not saturated. Added latency = TTFT percentile through the router minus
              the same percentile direct (p50_overhead_ms / p99_overhead_ms; the end-to-end stream
              latency difference is reported too), median over alternating short runs. The
              clients' starts are spread over one token interval, and each client waits a random
              time in [0, `--think-ms`) (default: one token interval) before each request, so
              requests arrive at random phases of the other streams' tokens (see closed_loop;
              `--think-ms 0` is the earlier back-to-back loop).
  throughput  no delay, `--rps-tokens` tokens per request: requests/s each router sustains (best run),
              and each router process's own CPU time per request (median run), which does not
              depend on what the stand-ins and the client cost on shared cores. Each router runs at
              its own saturation rate here; the latency phase's CPU per request
              (`latency_cpu_ms_per_request`) compares them at the same request rate.
All processes share this machine's cores with the client; both routers get the same conditions.

    python -m bench.router_overhead [--json]        (the default of the study's entry, __main__.py)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
from pathlib import Path

from bench.router_overhead.load_client import closed_loop
from bench.router_overhead.targets import Procs, cpu_seconds, start_targets

STUDIES = """the other studies of the same question, each with its own flags (--help):
  ttft-path   where the added TTFT goes, step by step, ours against the control (ttft_path.py)
  pick        the router's own per-request worker choice at fleet scale, no network (pick.py)
  http-layer  the router's HTTP layer alone, CPU per request (http_layer.py)
  responses   what /v1/responses adds over /v1/chat/completions at the router (responses.py)
  cold        the steps before the gRPC call with the caches evicted, as the latency phase finds them (cold_steps.py)"""


def run_phase(name: str, token_delay_s: float, tokens: int, think_s: float, args, model_dir: Path) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix=f"router_overhead_{name}_"))
    procs = Procs(tmp)
    try:
        urls = start_targets(procs, tmp, token_delay_s, model_dir, args.floor)
        out: dict[str, list[dict]] = {}
        # NOTE: the machine is shared; alternating the targets in short runs and comparing each
        # router with the direct run next to it keeps background load from deciding the result.
        for _ in range(args.repeats):
            for key in ("ours_direct", "ours", "sglang_direct", "sglang", "floor"):
                if urls[key] is None:
                    continue
                pid = urls["pids"].get(key)
                cpu0 = cpu_seconds(pid) if pid else 0.0
                res = asyncio.run(closed_loop(urls[key], args.concurrency, tokens, args.warmup_s, args.duration_s,
                                              args.keep_alive, token_delay_s, args.client, think_s))
                if pid:  # the router's own CPU per request, whatever the stand-ins and the client cost
                    res["cpu_ms_per_request"] = (cpu_seconds(pid) - cpu0) * 1000 / res["completed"]
                if not args.json:
                    print(f"  {name:10s} {key:14s} " + "  ".join(f"{k}={v:.1f}" for k, v in res.items()), flush=True)
                out.setdefault(key, []).append(res)
        return out
    finally:
        procs.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.router_overhead", description=__doc__.splitlines()[0],
                                 epilog=STUDIES, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=64, help="open streams (closed loop)")
    ap.add_argument("--tokens", type=int, default=16, help="tokens per request in the latency phase")
    ap.add_argument("--token-delay-ms", type=float, default=40.0, help="stand-in delay between tokens (latency phase)")
    ap.add_argument("--think-ms", type=float, default=None,
                    help="latency phase: random wait in [0, this) before each request (default: --token-delay-ms)")
    ap.add_argument("--rps-tokens", type=int, default=4, help="tokens per request in the throughput phase")
    ap.add_argument("--warmup-s", type=float, default=1.0)
    ap.add_argument("--duration-s", type=float, default=5.0)
    ap.add_argument("--repeats", type=int, default=3, help="alternating runs per target (short runs, compared pairwise)")
    ap.add_argument("--keep-alive", action="store_true",
                    help="reuse client HTTP connections (default: one connection per request, see closed_loop)")
    ap.add_argument("--client", choices=["lean", "aiohttp"], default="lean",
                    help="load generator (load_client.py): lean asyncio HTTP + lean gRPC, or aiohttp + grpc.aio")
    ap.add_argument("--no-floor", dest="floor", action="store_false",
                    help="leave out the control (floor.py, the least a Python router does)")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = ap.parse_args(argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    from engine.prepare import make_tiny_model

    model_dir = make_tiny_model(Path(tempfile.mkdtemp(prefix="router_overhead_model_")))
    think_ms = args.token_delay_ms if args.think_ms is None else args.think_ms
    lat = run_phase("latency", args.token_delay_ms / 1000, args.tokens, think_ms / 1000, args, model_dir)
    thr = run_phase("throughput", 0.0, args.rps_tokens, 0.0, args, model_dir)
    shutil.rmtree(model_dir, ignore_errors=True)

    def overhead(via: str, direct: str, field: str) -> float | None:
        """Median over the alternating runs of (through the router - direct)."""
        if via not in lat:
            return None
        return round(statistics.median(v[field] - d[field] for v, d in zip(lat[via], lat[direct])), 3)

    def cpu_per_request(key: str, phase: dict = thr) -> float | None:
        return round(statistics.median(r["cpu_ms_per_request"] for r in phase[key]), 3) if key in phase else None

    def cpu_ratio(key: str, base: str, phase: dict = thr) -> float | None:
        """Median over the alternating runs of key's CPU per request / base's in the run next to it."""
        if key not in phase or base not in phase:
            return None
        return round(statistics.median(a["cpu_ms_per_request"] / b["cpu_ms_per_request"]
                                       for a, b in zip(phase[key], phase[base])), 3)

    def best_rps(key: str) -> float | None:
        return round(max(r["rps"] for r in thr[key]), 1) if key in thr else None

    result = {
        "concurrency": args.concurrency, "tokens": args.tokens, "token_delay_ms": args.token_delay_ms,
        "keep_alive": args.keep_alive, "client": args.client, "think_ms": think_ms,
        "p50_overhead_ms": overhead("ours", "ours_direct", "ttft_p50_ms"),
        "p99_overhead_ms": overhead("ours", "ours_direct", "ttft_p99_ms"),
        "e2e_p50_overhead_ms": overhead("ours", "ours_direct", "e2e_p50_ms"),
        "e2e_p99_overhead_ms": overhead("ours", "ours_direct", "e2e_p99_ms"),
        # NOTE: the gRPC direct baseline uses another client (grpc.aio, one kept channel) than the
        # run through the router (aiohttp, a connection per request); the same HTTP client's
        # direct run against the HTTP stand-in (sglang-router's baseline) cancels the client's
        # cost, but charges the gRPC stand-in's extra cost to us. Both are reported.
        "p50_overhead_vs_http_direct_ms": overhead("ours", "sglang_direct", "ttft_p50_ms"),
        "p99_overhead_vs_http_direct_ms": overhead("ours", "sglang_direct", "ttft_p99_ms"),
        "sglang_router_p50_overhead_ms": overhead("sglang", "sglang_direct", "ttft_p50_ms"),
        "sglang_router_p99_overhead_ms": overhead("sglang", "sglang_direct", "ttft_p99_ms"),
        "sglang_router_e2e_p50_overhead_ms": overhead("sglang", "sglang_direct", "e2e_p50_ms"),
        "rps": best_rps("ours"), "direct_grpc_rps": best_rps("ours_direct"),
        "sglang_router_rps": best_rps("sglang"), "direct_http_rps": best_rps("sglang_direct"),
        "cpu_ms_per_request": cpu_per_request("ours"), "sglang_router_cpu_ms_per_request": cpu_per_request("sglang"),
        # NOTE: the throughput phase compares each router at its own saturation rate, and CPU per
        # request falls as the rate rises (one loop turn serves more requests). In the latency phase
        # the clients' pacing gives both routers the same request rate and a decode-paced stream.
        "latency_cpu_ms_per_request": cpu_per_request("ours", lat),
        "sglang_router_latency_cpu_ms_per_request": cpu_per_request("sglang", lat),
        "latency_rps": round(statistics.median(r["rps"] for r in lat["ours"]), 1),
        "sglang_router_latency_rps": round(statistics.median(r["rps"] for r in lat["sglang"]), 1) if "sglang" in lat else None,
        "python_floor_p50_overhead_ms": overhead("floor", "ours_direct", "ttft_p50_ms"),
        "python_floor_cpu_ms_per_request": cpu_per_request("floor"),
        "python_floor_latency_cpu_ms_per_request": cpu_per_request("floor", lat),
        # NOTE: paired ratios (each run against its neighbour in the alternation) move less with the
        # machine's load than the ratio of two medians. cpu_vs_floor above floor_cpu_vs_sglang's inverse
        # means the CPU target is missed whatever sglang-router measures in that run.
        "cpu_vs_sglang": cpu_ratio("ours", "sglang"), "latency_cpu_vs_sglang": cpu_ratio("ours", "sglang", lat),
        "cpu_vs_floor": cpu_ratio("ours", "floor"), "latency_cpu_vs_floor": cpu_ratio("ours", "floor", lat),
        "floor_cpu_vs_sglang": cpu_ratio("floor", "sglang"),
        "floor_latency_cpu_vs_sglang": cpu_ratio("floor", "sglang", lat),
    }
    result["rps_ratio"] = round(result["rps"] / result["sglang_router_rps"], 3) if result["sglang_router_rps"] else None
    if not args.json:
        print("\nlatency added by the router (latency phase: TTFT through the router minus direct; "
              "median over the alternating runs)")
        print(f"  pdorch router : p50 {result['p50_overhead_ms']:+} ms  p99 {result['p99_overhead_ms']:+} ms  "
              f"(end-to-end p50 {result['e2e_p50_overhead_ms']:+} ms)")
        if result["p50_overhead_vs_http_direct_ms"] is not None:
            print(f"  pdorch router vs the HTTP client's direct run: p50 {result['p50_overhead_vs_http_direct_ms']:+} ms  "
                  f"p99 {result['p99_overhead_vs_http_direct_ms']:+} ms")
        if result["sglang_router_rps"]:
            print(f"  sglang-router : p50 {result['sglang_router_p50_overhead_ms']:+} ms  "
                  f"p99 {result['sglang_router_p99_overhead_ms']:+} ms  "
                  f"(end-to-end p50 {result['sglang_router_e2e_p50_overhead_ms']:+} ms)")
        print(f"max requests/s (throughput phase, {args.rps_tokens} tokens each, {args.concurrency} streams)")
        print(f"  pdorch router : {result['rps']}  sglang-router: {result['sglang_router_rps']}  "
              f"ratio {result['rps_ratio']}")
        print(f"router CPU per request (throughput phase, median): pdorch {result['cpu_ms_per_request']} ms, "
              f"sglang-router {result['sglang_router_cpu_ms_per_request']} ms")
        print(f"router CPU per request (latency phase, the same request rate for both, median): pdorch "
              f"{result['latency_cpu_ms_per_request']} ms at {result['latency_rps']}/s, sglang-router "
              f"{result['sglang_router_latency_cpu_ms_per_request']} ms at {result['sglang_router_latency_rps']}/s")
        if result["python_floor_cpu_ms_per_request"] is not None:
            print(f"the control (bench/router_overhead/floor.py): CPU per request {result['python_floor_cpu_ms_per_request']} ms "
                  f"(throughput), {result['python_floor_latency_cpu_ms_per_request']} ms (latency phase); "
                  f"added TTFT p50 {result['python_floor_p50_overhead_ms']:+} ms")
            print(f"  paired CPU ratios (throughput / latency phase): ours/floor {result['cpu_vs_floor']} / "
                  f"{result['latency_cpu_vs_floor']}, floor/sglang-router {result['floor_cpu_vs_sglang']} / "
                  f"{result['floor_latency_cpu_vs_sglang']}, ours/sglang-router {result['cpu_vs_sglang']} / "
                  f"{result['latency_cpu_vs_sglang']}")
    print(json.dumps(result))
    return 0

