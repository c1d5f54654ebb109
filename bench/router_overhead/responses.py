"""What `/v1/responses` adds at the router over `/v1/chat/completions`: the same prompt, sampling and
stand-in worker stream through one router.

    client --HTTP /v1/chat/completions--> pdorch router --gRPC Generate--> stand-in D (the baseline)
    client --HTTP /v1/responses---------> pdorch router --gRPC Generate--> stand-in D

Each repeat has three parts:
  latency  one closed-loop run in which every client alternates the two routes request by request,
           so both see the same load from the rest of the (shared) machine: TTFT p50 and end-to-end
           p50 of each route, responses minus chat. Separate runs per route moved with the other
           sessions' load by more than the difference measured (+-2 ms end to end on this VM).
  cpu      one run per route (the order flipped every repeat): the router process's CPU per request
           (all of it: HTTP, gRPC, the loop; it moves with the machine's load by +-0.3 ms).
  handler  in this process, the two routes' handlers on a router app whose worker stream is a stub
           that yields the tokens at once: CPU per request of the router's own code for a request
           (parse, convert, template, job, output shaping, events, store), without the HTTP and gRPC
           work both routes share; `--handler-requests` of each, in 10 blocks alternating the routes
           (the median block of each).
The results are medians over the repeats. The stand-in paces tokens (`--token-delay-ms`) and each
client thinks a random time up to one token interval before each request, as compare.py's latency
phase does. `/v1/responses` runs with its defaults (store on: every response is stored).

    python -m bench.router_overhead responses [--repeats 7] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench.router_overhead.handler_cpu import StubbedHandlers
from bench.router_overhead.load_client import LeanHTTP, Sample, closed_loop, summarize
from bench.router_overhead.targets import Procs, cpu_seconds, start_targets

PROMPT = "Summarise the weather in Oslo for the coming week in two sentences, and say whether to take a coat."
ROUTES = ("chat", "responses")


def bodies(tokens: int) -> dict[str, tuple[str, dict]]:
    """The two routes' requests: one prompt, one sampling, `tokens` streamed tokens."""
    return {"chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": tokens,
                                              "temperature": 0.0, "stream": True}),
            "responses": ("/v1/responses", {"input": PROMPT, "max_output_tokens": tokens, "temperature": 0.0,
                                            "stream": True})}


async def interleaved(url: str, requests: dict[str, tuple[str, dict]], concurrency: int, warmup_s: float,
                      duration_s: float, think_s: float) -> dict[str, dict]:
    """Closed loop, each client alternating the routes (half the clients start with each); the
    summary (load_client.summarize) of each route's requests started and finished in the window."""
    http = {route: LeanHTTP(url, json.dumps(body).encode(), False, path) for route, (path, body) in requests.items()}
    samples: dict[str, list[Sample]] = {route: [] for route in ROUTES}
    t_measure = time.perf_counter() + warmup_s
    t_end = t_measure + duration_s

    async def client(i: int) -> None:
        rng = random.Random(i)
        await asyncio.sleep(i * think_s / concurrency)
        for n in range(i, 1 << 30):
            await asyncio.sleep(rng.random() * think_s)
            t0 = time.perf_counter()
            if t0 >= t_end:
                return
            route = ROUTES[n % 2]
            s = await http[route].one([])
            if t0 >= t_measure and time.perf_counter() <= t_end:
                samples[route].append(s)

    await asyncio.gather(*(client(i) for i in range(concurrency)))
    return {route: summarize(samples[route], duration_s) for route in ROUTES}


async def handler_blocks(stubbed: StubbedHandlers, requests: dict[str, tuple[str, dict]], total: int,
                         blocks: int = 10) -> dict[str, dict]:
    """Each route's handler CPU per request: the median of `blocks` blocks, the routes alternating
    block by block (a drift of the machine's load lands on both)."""
    us: dict[str, list[float]] = {route: [] for route in ROUTES}
    for b in range(blocks):
        for route in ROUTES if b % 2 == 0 else ROUTES[::-1]:
            us[route].append(await stubbed.cpu_us(*requests[route], max(1, total // blocks)))
    return {route: {"us_per_request": statistics.median(us[route])} for route in ROUTES}


def added(runs: list[dict], field: str) -> float:
    """Median over the repeats of (responses - chat) in `field`."""
    return round(statistics.median(r["responses"][field] - r["chat"][field] for r in runs), 4)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.router_overhead responses", description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=32, help="open streams (closed loop)")
    ap.add_argument("--tokens", type=int, default=16, help="tokens per request")
    ap.add_argument("--token-delay-ms", type=float, default=20.0, help="stand-in delay between tokens")
    ap.add_argument("--warmup-s", type=float, default=1.0)
    ap.add_argument("--duration-s", type=float, default=4.0, help="the latency run's window")
    ap.add_argument("--cpu-duration-s", type=float, default=2.0, help="each CPU run's window")
    ap.add_argument("--handler-requests", type=int, default=2000, help="requests of each route, handler part")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = ap.parse_args(argv)
    import uvloop

    uvloop.install()
    from engine.prepare import make_tiny_model

    model_dir = make_tiny_model(Path(tempfile.mkdtemp(prefix="router_overhead_model_")))
    tmp = Path(tempfile.mkdtemp(prefix="router_overhead_responses_"))
    procs = Procs(tmp)
    delay_s = args.token_delay_ms / 1000
    latency: list[dict] = []
    cpu: list[dict] = []
    handler: list[dict] = []
    try:
        urls = start_targets(procs, tmp, delay_s, model_dir, floor=False)
        pid, requests = urls["pids"]["ours"], bodies(args.tokens)
        stubbed = StubbedHandlers(model_dir)
        for i in range(args.repeats):
            order = ROUTES if i % 2 == 0 else ROUTES[::-1]  # the order flips: a drift favours neither
            handler.append(asyncio.run(handler_blocks(stubbed, requests, args.handler_requests)))
            latency.append(asyncio.run(interleaved(urls["ours"], requests, args.concurrency, args.warmup_s,
                                                   args.duration_s, delay_s)))
            per_route = {}
            for route in order:
                cpu0 = cpu_seconds(pid)
                res = asyncio.run(closed_loop(urls["ours"], args.concurrency, args.tokens, args.warmup_s,
                                              args.cpu_duration_s, False, delay_s, "lean", delay_s, requests[route]))
                per_route[route] = {"cpu_ms_per_request": (cpu_seconds(pid) - cpu0) * 1000 / res["completed"]}
            cpu.append(per_route)
            if not args.json:
                for route in ROUTES:
                    print(f"  {route:10s} " + "  ".join(f"{k}={v:.3f}" for k, v in
                                                        {**latency[-1][route], **per_route[route],
                                                         **handler[-1][route]}.items()), flush=True)
    finally:
        procs.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(model_dir, ignore_errors=True)

    def median(runs: list[dict], route: str, field: str) -> float:
        return round(statistics.median(r[route][field] for r in runs), 4)

    result = {"concurrency": args.concurrency, "tokens": args.tokens, "token_delay_ms": args.token_delay_ms,
              "repeats": args.repeats,
              "chat_ttft_p50_ms": median(latency, "chat", "ttft_p50_ms"),
              "chat_e2e_p50_ms": median(latency, "chat", "e2e_p50_ms"),
              "added_ttft_p50_ms": added(latency, "ttft_p50_ms"), "added_e2e_p50_ms": added(latency, "e2e_p50_ms"),
              "chat_cpu_ms_per_request": median(cpu, "chat", "cpu_ms_per_request"),
              "added_cpu_ms_per_request": added(cpu, "cpu_ms_per_request"),
              "chat_handler_us_per_request": median(handler, "chat", "us_per_request"),
              "added_handler_us_per_request": added(handler, "us_per_request")}
    if not args.json:
        print(f"\n/v1/responses minus /v1/chat/completions (median over {args.repeats} repeats): TTFT p50 "
              f"{result['added_ttft_p50_ms']:+} ms, end-to-end p50 {result['added_e2e_p50_ms']:+} ms (chat: "
              f"{result['chat_ttft_p50_ms']} / {result['chat_e2e_p50_ms']} ms), router CPU per request "
              f"{result['added_cpu_ms_per_request']:+} ms (chat: {result['chat_cpu_ms_per_request']} ms), the handler's "
              f"own CPU per request {result['added_handler_us_per_request']:+} µs (chat: "
              f"{result['chat_handler_us_per_request']} µs)")
    print(json.dumps(result))
    return 0
