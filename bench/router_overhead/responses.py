"""What `/v1/responses` adds at the router over `/v1/chat/completions`: the same prompt, sampling and
stand-in worker stream through one router, the two routes alternating in short closed-loop runs.

    client --HTTP /v1/chat/completions--> pdorch router --gRPC Generate--> stand-in D (the baseline)
    client --HTTP /v1/responses---------> pdorch router --gRPC Generate--> stand-in D

Per pair of runs (responses, then chat, the order flipped every pair): the TTFT p50, the end-to-end
p50 and the router process's CPU per request, responses minus chat; the result is the median over
the pairs. The stand-in paces tokens (`--token-delay-ms`) and each client thinks a random time up to
one token interval before each request, as compare.py's latency phase does: the router is not
saturated, so its added CPU per request shows as added latency. `/v1/responses` runs with its
defaults (store on: every response is stored, a chain of one).

    python -m bench.router_overhead responses [--repeats 7] [--json]
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

PROMPT = "Summarise the weather in Oslo for the coming week in two sentences, and say whether to take a coat."


def bodies(tokens: int) -> dict[str, tuple[str, dict]]:
    """The two routes' requests: one prompt, one sampling, `tokens` streamed tokens."""
    return {"chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": tokens,
                                              "temperature": 0.0, "stream": True}),
            "responses": ("/v1/responses", {"input": PROMPT, "max_output_tokens": tokens, "temperature": 0.0,
                                            "stream": True})}


def paired(runs: dict[str, list[dict]], field: str) -> float:
    """Median over the pairs of (responses - chat) in `field`."""
    return round(statistics.median(r[field] - c[field] for r, c in zip(runs["responses"], runs["chat"])), 4)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.router_overhead responses", description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=32, help="open streams (closed loop)")
    ap.add_argument("--tokens", type=int, default=16, help="tokens per request")
    ap.add_argument("--token-delay-ms", type=float, default=20.0, help="stand-in delay between tokens")
    ap.add_argument("--warmup-s", type=float, default=1.0)
    ap.add_argument("--duration-s", type=float, default=4.0)
    ap.add_argument("--repeats", type=int, default=7, help="pairs of runs (responses and chat, alternating)")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = ap.parse_args(argv)
    import uvloop

    uvloop.install()
    from engine.prepare import make_tiny_model

    model_dir = make_tiny_model(Path(tempfile.mkdtemp(prefix="router_overhead_model_")))
    tmp = Path(tempfile.mkdtemp(prefix="router_overhead_responses_"))
    procs = Procs(tmp)
    delay_s = args.token_delay_ms / 1000
    runs: dict[str, list[dict]] = {"chat": [], "responses": []}
    try:
        urls = start_targets(procs, tmp, delay_s, model_dir, floor=False)
        pid, requests = urls["pids"]["ours"], bodies(args.tokens)
        for i in range(args.repeats):
            # NOTE: the order flips every pair, so a drift of the machine's load favours neither route
            for route in ("responses", "chat") if i % 2 == 0 else ("chat", "responses"):
                cpu0 = cpu_seconds(pid)
                res = asyncio.run(closed_loop(urls["ours"], args.concurrency, args.tokens, args.warmup_s,
                                              args.duration_s, False, delay_s, "lean", delay_s, requests[route]))
                res["cpu_ms_per_request"] = (cpu_seconds(pid) - cpu0) * 1000 / res["completed"]
                runs[route].append(res)
                if not args.json:
                    print(f"  {route:10s} " + "  ".join(f"{k}={v:.3f}" for k, v in res.items()), flush=True)
    finally:
        procs.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(model_dir, ignore_errors=True)
    result = {"concurrency": args.concurrency, "tokens": args.tokens, "token_delay_ms": args.token_delay_ms,
              "pairs": args.repeats,
              "chat_ttft_p50_ms": round(statistics.median(r["ttft_p50_ms"] for r in runs["chat"]), 3),
              "responses_ttft_p50_ms": round(statistics.median(r["ttft_p50_ms"] for r in runs["responses"]), 3),
              "added_ttft_p50_ms": paired(runs, "ttft_p50_ms"), "added_e2e_p50_ms": paired(runs, "e2e_p50_ms"),
              "chat_cpu_ms_per_request": round(statistics.median(r["cpu_ms_per_request"] for r in runs["chat"]), 4),
              "added_cpu_ms_per_request": paired(runs, "cpu_ms_per_request")}
    if not args.json:
        print(f"\n/v1/responses minus /v1/chat/completions (median over {args.repeats} pairs): TTFT p50 "
              f"{result['added_ttft_p50_ms']:+} ms, end-to-end p50 {result['added_e2e_p50_ms']:+} ms, router CPU "
              f"per request {result['added_cpu_ms_per_request']:+} ms (chat: {result['chat_cpu_ms_per_request']} ms)")
    print(json.dumps(result))
    return 0
