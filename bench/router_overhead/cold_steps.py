"""What the router's steps before the gRPC call cost cold: caches evicted before each call, as the
comparison's latency phase finds them.

In the latency phase (compare.py: 64 streams, a token every 40 ms) a request arrives every ~10 ms,
and between two requests the client, the stand-ins and the other streams' tokens run on the same 2
cores: `ttft-path` times the body's reading at ~25 µs a request where `timeit` gives ~4 µs. This
reproduces that: each step runs once after 32 MiB were touched (L1, L2 and most of L3 evicted) and
once again at once, `--calls` times, on the app's /generate handler (handler_cpu.py: no worker).
Cold, every function call and every object first touched costs microseconds: what a step costs is
about how much code and data it touches, which is why fewer layers matter more than faster ones.

    python -m bench.router_overhead cold [--calls 300] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

EVICT_BYTES = 32 << 20
BODY = {"stream": True, "sampling_params": {"max_new_tokens": 4, "temperature": 0.0}, "input_ids": list(range(1, 65))}


def _p50_us(fn: Callable[[], object], calls: int, evict: bytearray | None) -> float:
    times = []
    for _ in range(calls):
        if evict is not None:
            evict[::64] = bytes(len(evict) // 64)  # a write to every cache line
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return round(statistics.median(times) / 1000, 2)


def measure(model_dir: Path, calls: int) -> dict[str, dict[str, float]]:
    import orjson

    from bench.router_overhead.handler_cpu import StubbedHandlers
    from router.http.bodies import GenerateRequest, parse
    from router.http.hot_path import HotRequest
    from store_client.page_hash import page_hashes

    gen = StubbedHandlers(model_dir).handlers[b"/generate"].__self__
    raw = orjson.dumps(BODY)
    gen.generate_job(raw, 0.0)  # the full way once: the memo knows the body's sampling
    assert gen.plain.read(raw)[0] is not None
    spec = gen.generate_job(raw, 0.0).spec
    request = HotRequest("/generate", [(b"content-type", b"application/json")])
    steps: dict[str, Callable[[], object]] = {
        "a call of an empty function": lambda: None,
        "orjson.loads of the body (the control parses this way)": lambda: orjson.loads(raw),
        "the body read the plain way (PlainGenerateReader.read)": lambda: gen.plain.read(raw),
        "the body to a JobSpec, plain (generate_job)": lambda: gen.generate_job(raw, 0.0),
        "the body parsed the full way (pydantic)": lambda: parse(GenerateRequest, raw),
        "the body to a JobSpec, the full way": lambda: gen._generate_job(parse(GenerateRequest, raw), 0.0, None),
        "the job's checks and the Job (RouterService._job)": lambda: gen.svc._job(request, "/generate", spec),
        "the prompt's page hashes (4 pages)": lambda: page_hashes(spec.ids, 16),
    }
    evict = bytearray(EVICT_BYTES)
    return {name: {"cold_us": _p50_us(fn, calls, evict), "warm_us": _p50_us(fn, calls, None)}
            for name, fn in steps.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.router_overhead cold", description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=300, help="calls per step, cold and warm each")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = ap.parse_args(argv)
    from engine.prepare import make_tiny_model

    model_dir = make_tiny_model(Path(tempfile.mkdtemp(prefix="router_cold_model_")))
    try:
        result = measure(model_dir, args.calls)
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)
    for name, r in result.items():
        print(f"{name:58s} cold p50 {r['cold_us']:7.1f} µs   warm p50 {r['warm_us']:6.1f} µs")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
