"""What tracing adds to the router's TTFT: the same requests through routers that differ only in their
`observability` section, against one pair of stand-in workers, in one run.

    off      tracing off (the default: no tracer)
    off_b    the same again: off_b - off is the run's noise
    ratio_1  sample_ratio 1.0: every request's router.request + router.attempt spans, the in-memory ring
             (keep_traces 1000) and the OTLP batch export to a receiver in a process of its own
    ratio_0  sample_ratio 0.0, the ring and the exporter set up: nothing sampled (parent-based: the
             traceparent still goes to the workers, unsampled)
    ring     sample_ratio 1.0, the ring only (no collector: `pdorch trace`); ratio_1 - ring is the export

Each repeat is one closed loop in which every client sends to the five routers in turn, request by
request, so all five see the same load from the rest of the machine; the stand-ins pace tokens
(`--token-delay-ms`) and each client thinks a random time up to one token interval before each
request (as compare.py's latency phase). Reported: each variant's TTFT p50 minus off's, the median
over the repeats, and the same for the routers' CPU per request.

The part that does not move with the machine: `spans`, in this process, one request's router spans
(router/dispatch/request_trace.py: start, attempt, traceparent, outcome, end) `--span-requests` times
per variant, the process's CPU per request, the exporter's thread and its gRPC to the receiver
included (flushed before the clock stops; the export queue holds every span, so none is dropped
uncounted), and of it what runs on the event loop: before the first token (start, attempt,
traceparent) and after it (outcome, end: the spans handed to the ring and the export queue).

    python -m bench.router_overhead tracing [--repeats 5] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.router_overhead.load_client import GENERATE_BODY, LeanHTTP, Sample, summarize
from bench.router_overhead.targets import Procs, cpu_seconds, wait_http, wait_port
from pdorch.local_stack.processes import free_port

VARIANTS = ("off", "off_b", "ratio_1", "ratio_0", "ring")


def observability(variant: str, otlp_port: int) -> dict:
    if variant.startswith("off"):
        return {}
    if variant == "ring":
        return {"keep_traces": 1000}
    return {"otlp_endpoint": f"http://127.0.0.1:{otlp_port}", "keep_traces": 1000,
            "sample_ratio": 1.0 if variant == "ratio_1" else 0.0}


def start(procs: Procs, tmp: Path, delay_s: float, model_dir: Path, variants=VARIANTS) -> dict:
    """Stand-ins, the OTLP receiver and a router per variant: variant -> (URL, pid), and "otlp_port"."""
    py = sys.executable
    p_port, d_port, o_port = free_port(), free_port(), free_port()
    d = procs.start("standin_decode", [py, "-m", "pdorch.local_stack.standin", "--role", "decode", "--port", str(d_port),
                                       "--token-delay-s", str(delay_s)])
    p = procs.start("standin_prefill", [py, "-m", "pdorch.local_stack.standin", "--role", "prefill", "--port", str(p_port)])
    o = procs.start("otlp_receiver", [py, "-m", "pdorch.local_stack.otlp", "--port", str(o_port)])
    for port, proc in ((d_port, d), (p_port, p), (o_port, o)):
        wait_port(port, 30, proc)
    out = {"otlp_port": o_port}
    for variant in variants:
        r_port = free_port()
        cfg = tmp / f"router_{variant}.yaml"
        cfg.write_text(json.dumps({
            "model": {"source": str(model_dir), "cache_dir": str(tmp / "models"), "page_size": 16},
            "router": {"host": "127.0.0.1", "port": r_port, "max_queued_requests": 4096, "policy": "least_load"},
            "discovery": {"mode": "static", "prefill": [f"127.0.0.1:{p_port}"], "decode": [f"127.0.0.1:{d_port}"]},
            "observability": observability(variant, o_port)}))
        r = procs.start(f"router_{variant}", [py, "-m", "router", "--config", str(cfg), "--log-level", "warning"])
        wait_http(f"http://127.0.0.1:{r_port}/health", 60, r)
        out[variant] = (f"http://127.0.0.1:{r_port}", r.pid)
    return out


async def round_robin(urls: dict[str, str], tokens: int, concurrency: int, warmup_s: float, duration_s: float,
                      think_s: float) -> dict[str, dict]:
    body = json.dumps(dict(GENERATE_BODY, sampling_params={"max_new_tokens": tokens, "temperature": 0.0})).encode()
    http = {v: LeanHTTP(url, body, False) for v, url in urls.items()}
    order = list(urls)
    samples: dict[str, list[Sample]] = {v: [] for v in urls}
    completed = dict.fromkeys(urls, 0)  # every request, warm-up included (what the CPU time covers)
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
            variant = order[n % len(order)]
            s = await http[variant].one([])
            completed[variant] += 1
            if t0 >= t_measure and time.perf_counter() <= t_end:
                samples[variant].append(s)

    await asyncio.gather(*(client(i) for i in range(concurrency)))
    return {v: dict(summarize(samples[v], duration_s), completed=completed[v]) for v in urls}


def span_cpu_us(variant: str, otlp_port: int, requests: int) -> tuple[float, float, float]:
    """CPU µs per request of the router's spans of one request, exported and kept as `variant` says:
    (all of it, the exporter's thread included; on the loop before the first token; on the loop after)."""
    from pdorch.config import ObservabilityConfig
    from pdorch.tracing import setup_tracing
    from router.dispatch.request_trace import RequestTrace
    from router.http.formats import Progress

    cfg = dict(observability(variant, otlp_port), export_queue_size=2 * requests + 64)
    tracing = setup_tracing(ObservabilityConfig(**cfg), "pdorch-router", "bench")
    if not tracing.enabled:
        return 0.0, 0.0, 0.0

    class Worker:  # what the trace reads of one
        def __init__(self, address: str):
            self.address, self.load = address, 0

    p, d = Worker("10.0.0.1:50161"), Worker("10.0.0.2:50171")
    progress = Progress("r", 64)
    progress.finish_reason = "length"
    before = after = 0.0
    t0 = time.process_time()
    for i in range(requests):
        t1 = time.thread_time()
        trace = RequestTrace(tracing, None, None, "/generate", "model")
        trace.request(f"r{i}", 64)
        trace.attempt(p, d, "cache_aware", "prefix_match", [p], False)
        trace.traceparent()
        t2 = time.thread_time()
        trace.finished([progress])
        trace.end(200)
        before, after = before + t2 - t1, after + time.thread_time() - t2
        if i % 64 == 0:
            time.sleep(0.001)  # let the exporter's thread run alongside, as between a router's requests
    if tracing.provider is not None:
        tracing.provider.force_flush(30_000)
    cpu = time.process_time() - t0
    tracing.shutdown()
    return cpu / requests * 1e6, before / requests * 1e6, after / requests * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.router_overhead tracing", description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=16, help="open streams (closed loop), over the routers")
    ap.add_argument("--tokens", type=int, default=16, help="tokens per request")
    ap.add_argument("--token-delay-ms", type=float, default=20.0, help="stand-in delay between tokens")
    ap.add_argument("--warmup-s", type=float, default=1.0)
    ap.add_argument("--duration-s", type=float, default=5.0, help="each repeat's window")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="which routers (off always)")
    ap.add_argument("--span-requests", type=int, default=5000, help="requests of each variant, spans part")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = ap.parse_args(argv)
    variants = ("off", *(v for v in args.variants.split(",") if v in VARIANTS and v != "off"))
    import uvloop

    uvloop.install()
    from engine.prepare import make_tiny_model

    model_dir = make_tiny_model(Path(tempfile.mkdtemp(prefix="router_overhead_model_")))
    tmp = Path(tempfile.mkdtemp(prefix="router_overhead_tracing_"))
    procs = Procs(tmp)
    delay_s = args.token_delay_ms / 1000
    runs: list[dict] = []
    spans: dict[str, list[tuple[float, float, float]]] = {v: [] for v in variants if not v.startswith("off")}
    try:
        routers = start(procs, tmp, delay_s, model_dir, variants)
        otlp_port = routers.pop("otlp_port")
        urls = {v: url for v, (url, _) in routers.items()}
        for _ in range(args.repeats):
            cpu0 = {v: cpu_seconds(pid) for v, (_, pid) in routers.items()}
            res = asyncio.run(round_robin(urls, args.tokens, args.concurrency, args.warmup_s, args.duration_s, delay_s))
            for v, (_, pid) in routers.items():
                res[v]["cpu_ms_per_request"] = (cpu_seconds(pid) - cpu0[v]) * 1000 / max(1, res[v]["completed"])
            runs.append(res)
            for v, us in spans.items():
                us.append(span_cpu_us(v, otlp_port, args.span_requests))
            if not args.json:
                print("  " + "  ".join(f"{v}: ttft_p50={res[v]['ttft_p50_ms']:.3f} ms n={res[v]['completed']}"
                                       for v in variants), flush=True)
    finally:
        procs.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(model_dir, ignore_errors=True)

    def added(variant: str, field: str) -> float:
        return round(statistics.median(r[variant][field] - r["off"][field] for r in runs), 4)

    def spread(variant: str) -> list[float]:
        """The quartiles of the repeats' TTFT p50 differences: how far one repeat's number is from noise."""
        diffs = [r[variant]["ttft_p50_ms"] - r["off"]["ttft_p50_ms"] for r in runs]
        return [round(q, 4) for q in statistics.quantiles(diffs, n=4)[::2]] if len(diffs) > 1 else []

    result = {"concurrency": args.concurrency, "tokens": args.tokens, "token_delay_ms": args.token_delay_ms,
              "repeats": args.repeats,
              "off_ttft_p50_ms": round(statistics.median(r["off"]["ttft_p50_ms"] for r in runs), 4),
              **{f"added_ttft_p50_ms_{v}": added(v, "ttft_p50_ms") for v in variants[1:]},
              **{f"added_ttft_p50_ms_{v}_quartiles": spread(v) for v in variants[1:]},
              "off_cpu_ms_per_request": round(statistics.median(r["off"]["cpu_ms_per_request"] for r in runs), 4),
              **{f"added_cpu_ms_per_request_{v}": added(v, "cpu_ms_per_request") for v in variants[1:]},
              **{f"span_{part}_us_per_request_{v}": round(statistics.median(u[i] for u in us), 1)
                 for v, us in spans.items() for i, part in enumerate(("cpu", "loop_before_first_token", "loop_after"))}}
    if not args.json and variants == VARIANTS:
        print(f"\nTTFT p50 added over tracing off (median over {args.repeats} repeats; off: "
              f"{result['off_ttft_p50_ms']} ms): noise (off again) {result['added_ttft_p50_ms_off_b']:+} ms, "
              f"ratio 1.0 {result['added_ttft_p50_ms_ratio_1']:+} ms (ring only {result['added_ttft_p50_ms_ring']:+} ms), "
              f"ratio 0 {result['added_ttft_p50_ms_ratio_0']:+} ms; "
              f"router CPU per request (off: {result['off_cpu_ms_per_request']} ms): ratio 1.0 "
              f"{result['added_cpu_ms_per_request_ratio_1']:+} ms, ratio 0 {result['added_cpu_ms_per_request_ratio_0']:+} ms; "
              f"the spans' own CPU per request: ratio 1.0 {result['span_cpu_us_per_request_ratio_1']} µs, ratio 0 "
              f"{result['span_cpu_us_per_request_ratio_0']} µs, ring only {result['span_cpu_us_per_request_ring']} µs; "
              f"on the loop at ratio 1.0: {result['span_loop_before_first_token_us_per_request_ratio_1']} µs before "
              f"the first token, {result['span_loop_after_us_per_request_ratio_1']} µs after")
    print(json.dumps(result))
    return 0
