"""Where the router's CPU per request goes: the router process run under cProfile while the
comparison's throughput phase load (64 streams, no token delay, 4 tokens per request) goes through it;
`--latency` runs its latency phase's load instead (16 tokens 40 ms apart, each client thinking up to
one token interval before each request): the per-token path's share.

The stand-ins and the router start as in compare.py (targets.py); only the router runs through
this module (`python -m bench.router_overhead.profile FILE -m router ...`): after a warm-up the
load's measured run is profiled between SIGUSR2 (start) and SIGUSR1 (stop, write FILE). The load
is a `/generate` body (the comparison's) or a plain streamed chat (`--route chat`: one user message,
no tools, no logprobs). `--target floor` profiles the control (floor.py, /generate only) instead:
what any Python proxy on the same loop, gRPC client and SSE body pays. Reported: requests served, Python calls per request, and the functions with
the most own time (tottime) and the most time under them (cumtime), in µs of the router's main thread's CPU per request.
cProfile's per-call cost inflates code made of many small calls: read the ranking and the call
counts, not the absolute µs (compare.py measures the router's CPU per request without it).

    python -m bench.router_overhead profile [--route generate|chat] [--target router|floor] [--latency] [--duration-s 8]
                                            [--top 25] [--save FILE] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import runpy
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from bench.router_overhead.load_client import closed_loop
from bench.router_overhead.responses import PROMPT
from bench.router_overhead.targets import Procs, start_targets

TOKENS = 4
LATENCY_TOKENS, LATENCY_DELAY_S = 16, 0.040
CONCURRENCY = 64
REQUESTS = {"generate": None,  # load_client's GENERATE_BODY
            "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": TOKENS,
                                              "temperature": 0.0, "stream": True})}


def _profiled_start(procs: Procs, out: Path, target: str):
    start = procs.start
    process = {"router": "pdorch_router", "floor": "python_floor"}[target]

    def profiled(name: str, args: list[str]):
        if name == process:  # [py, -m, router | bench.router_overhead.floor, ...]
            args = [args[0], "-m", "bench.router_overhead.profile", str(out), *args[1:]]
        return start(name, args)

    return profiled


def _where(func: tuple) -> str:
    path, line, name = func
    if path == "~":
        return name
    parts = Path(path).parts
    for root in ("router", "pdorch", "proto", "engine", "uvicorn", "starlette", "google", "asyncio", "prometheus_client"):
        if root in parts:
            path = "/".join(parts[len(parts) - 1 - parts[::-1].index(root):])
            break
    else:
        path = Path(path).name
    return f"{path}:{line}({name})"


def table(stats: pstats.Stats, requests: int, key: int, top: int) -> list[dict]:
    """The `top` functions by own time (key 2) or cumulative time (key 3), per request."""
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][key], reverse=True)[:top]
    return [{"function": _where(func), "calls": round(nc / requests, 2), "own_us": round(tt / requests * 1e6, 1),
             "cum_us": round(ct / requests * 1e6, 1)} for func, (_cc, nc, tt, ct, _callers) in rows]


def run(route: str, duration_s: float, top: int, save: str | None = None, target: str = "router",
        latency: bool = False) -> dict:
    if target == "floor" and route != "generate":
        raise ValueError("the control serves /generate only")
    tmp = Path(tempfile.mkdtemp(prefix="router_profile_"))
    prof = tmp / "router.prof"
    procs = Procs(tmp)
    procs.start = _profiled_start(procs, prof, target)
    try:
        delay_s, tokens = (LATENCY_DELAY_S, LATENCY_TOKENS) if latency else (0.0, TOKENS)
        body = REQUESTS[route]
        if body is not None:
            body = (body[0], dict(body[1], max_tokens=tokens))

        def load(seconds: float) -> dict:
            return asyncio.run(closed_loop(url, CONCURRENCY, tokens, 0.0, seconds, stagger_s=delay_s, think_s=delay_s,
                                           request=body))

        urls = start_targets(procs, tmp, delay_s, _model(tmp), floor=target == "floor", sglang=False)
        key = "ours" if target == "router" else "floor"
        url, pid = urls[key], urls["pids"][key]
        load(1.0)  # warm-up
        os.kill(pid, signal.SIGUSR2)
        res = load(duration_s)
        os.kill(pid, signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while not prof.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"no profile in {prof} 10 s after SIGUSR1")
            time.sleep(0.05)
    finally:
        procs.stop()
    try:
        stats = pstats.Stats(str(prof))
        if save:
            shutil.copy(prof, save)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    requests = res["completed"]
    calls = sum(nc for (_cc, nc, _tt, _ct, _callers) in stats.stats.values())
    return {"route": route, "target": target, "phase": "latency" if latency else "throughput", "requests": requests, "python_calls_per_request": round(calls / requests),
            "profiled_cpu_us_per_request": round(stats.total_tt / requests * 1e6, 1),
            "own": table(stats, requests, 2, top), "cumulative": table(stats, requests, 3, top)}


def _model(tmp: Path) -> Path:
    from engine.prepare import make_tiny_model

    return make_tiny_model(tmp / "model")


def child(out: str, module_args: list[str]) -> None:
    """The router, profiled from SIGUSR2 to SIGUSR1 (which writes `out`); `module_args`: -m MODULE ARGS."""
    # NOTE: the main thread's CPU time, not wall time: on shared cores a wall clock charges the time the
    # router waits for its core (after each write that wakes a stand-in) to whatever call was running
    prof = cProfile.Profile(time.thread_time)

    def start(*_):
        prof.enable()

    def stop(*_):
        prof.disable()
        tmp = out + ".part"
        prof.dump_stats(tmp)
        os.rename(tmp, out)

    signal.signal(signal.SIGUSR2, start)
    signal.signal(signal.SIGUSR1, stop)
    sys.argv = [module_args[1], *module_args[2:]]
    runpy.run_module(module_args[1], run_name="__main__", alter_sys=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.router_overhead profile", description=__doc__.splitlines()[0])
    ap.add_argument("--route", choices=sorted(REQUESTS), default="chat")
    ap.add_argument("--target", choices=["router", "floor"], default="router")
    ap.add_argument("--latency", action="store_true", help="the latency phase's load (see above)")
    ap.add_argument("--duration-s", type=float, default=8.0, help="profiled load after 1 s of warm-up")
    ap.add_argument("--top", type=int, default=25, help="rows per table")
    ap.add_argument("--save", help="also keep the profile (pstats) in this file")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = ap.parse_args(argv)
    res = run(args.route, args.duration_s, args.top, args.save, args.target, args.latency)
    if not args.json:
        print(f"{res['target']} {res['route']}: {res['requests']} requests, {res['python_calls_per_request']} Python calls and "
              f"{res['profiled_cpu_us_per_request']} µs (profiled) per request")
        for name in ("own", "cumulative"):
            print(f"\n{name} time, µs per request:")
            for row in res[name]:
                print(f"  {row['own_us']:8.1f} own {row['cum_us']:8.1f} cum {row['calls']:6.2f} calls  {row['function']}")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":  # the profiled router (see _profiled_start)
    child(sys.argv[1], sys.argv[2:])
