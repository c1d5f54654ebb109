"""The real router's per-request worker choice at fleet scale: what admission reads of the pool (the
workers' smallest context, whether each role has a routable worker) and what `Policy.route`
runs (the prompt's page hashes, the pool's routable lists, `CacheAware.choose`, `on_routed`, `choose_decode`) on the KV-event
index, with N prefill and N decode workers, no network. The fleet simulation (bench/routing_sim.py,
removed after aa2abdb) timed the decision core (router/kv/choice.py); this times the router's own
wrapper around it.

Every worker has published a snapshot (a few conversations' pages in its L1, a load) and stays
live; prompts are 4-64 pages of 40 conversations; loads move as requests are routed and finish,
told to the policy as dispatch tells it (`load_changed`, timed for the two chosen workers; dispatch
tells it two more times per request, at the first token and at the end). `load_changed` only marks
the worker since dc949d4: the next decision moves the marked loads onto its boards, inside `choose`. Reported: per-step and
total p50/p99 in µs.

    python -m bench.router_overhead pick [--workers 500] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import time
from types import SimpleNamespace

from router.dispatch.policies import CacheAware, RouteContext
from router.fleet.circuit import CircuitBreaker
from router.fleet.workers import Worker, WorkerPool
from router.kv.choice import ChoiceWeights
from router.kv.index import KVIndex
from store_client.page_hash import page_hashes

STEPS = ("hashes", "admit", "routable", "choose", "on_routed", "choose_decode", "load_changed")


def _snapshot(l1: list[str], load: int):
    return SimpleNamespace(worker_id="w", epoch="e1", seq=1, snapshot=True, l1_stored=l1, l1_removed=[],
                           store_written=[], store_removed=[], free_pages=10_000, queued_requests=load,
                           running_requests=0, page_size=16, inflight_claimed=[], inflight_released=[])


def run(workers: int, decisions: int, warmup: int, seed: int = 1) -> dict:
    rng = random.Random(seed)
    conversations = [[hashlib.sha256(f"{c}/{i}".encode()).hexdigest() for i in range(64)] for c in range(40)]
    pool = WorkerPool(3, 1.0, 1.0)
    index = KVIndex(speculative_ttl_s=2.0)
    for role, port in (("prefill", 5000), ("decode", 6000)):
        for i in range(workers):
            address = f"10.{i // 250}.{i % 250}.1:{port}"
            w = pool._workers[(role, address)] = Worker(role, address, address, CircuitBreaker(3, 1.0), healthy=True)
            w.info = SimpleNamespace(max_context_tokens=8192)
            index.apply(address, _snapshot(rng.choice(conversations)[:rng.randrange(1, 16)], rng.randrange(4)))
            index.set_live(address, True)
    policy = CacheAware(kv_index=index, weights=ChoiceWeights())
    pool.on_remove.append(policy.forget)
    times: dict[str, list[float]] = {s: [] for s in STEPS}
    in_flight: list[Worker] = []
    for n in range(warmup + decisions):
        hashes = rng.choice(conversations)[:rng.choice((4, 16, 64))]
        prompt = [rng.randrange(50_000) for _ in range(16 * len(hashes))]
        th = time.perf_counter()
        page_hashes(prompt, 16)  # the prompt's own pages (Policy.prompt_hashes); the conversations' stand in for the index
        ta = time.perf_counter()
        # RouterService._job's context limit and the first routing's capacity check
        if not (pool.context_tokens() and pool.routable("prefill") and pool.routable("decode")):
            raise RuntimeError("the simulated fleet lost its context limit or its routable workers")
        t0 = time.perf_counter()
        prefills = pool.routable("prefill", set()) or pool.routable("prefill")
        decodes = pool.routable("decode", set()) or pool.routable("decode")
        t1 = time.perf_counter()
        ctx = RouteContext(hashes)
        p = policy.choose(prefills, ctx)
        t2 = time.perf_counter()
        policy.on_routed(p, ctx)
        t3 = time.perf_counter()
        d = policy.choose_decode(decodes, ctx)
        t4 = time.perf_counter()
        for w in (p, d):  # what dispatch does once they are chosen: their loads move
            w.in_flight += 1
            w.routed += 1
            policy.load_changed(w)
        t5 = time.perf_counter()
        in_flight += (p, d)
        while len(in_flight) > 4 * workers // 10:  # ~20 % of the fleet busy: the oldest finish
            w = in_flight.pop(rng.randrange(len(in_flight) // 2 + 1))
            w.in_flight -= 1
            policy.load_changed(w)
        if n >= warmup:
            for step, dt in zip(STEPS, (ta - th, t0 - ta, t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
                times[step].append(dt * 1e6)
    times["total"] = [sum(x) for x in zip(*(times[s] for s in STEPS))]

    def q(values: list[float], p: float) -> float:
        return round(sorted(values)[min(len(values) - 1, int(len(values) * p))], 1)

    return {"workers_per_role": workers, "decisions": decisions,
            **{f"{s}_p50_us": q(v, 0.5) for s, v in times.items()},
            **{f"{s}_p99_us": q(v, 0.99) for s, v in times.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.router_overhead pick",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=500, help="prefill workers, and as many decode workers")
    ap.add_argument("--decisions", type=int, default=5000)
    ap.add_argument("--warmup", type=int, default=2000)
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = ap.parse_args(argv)
    res = run(args.workers, args.decisions, args.warmup)
    if not args.json:
        for s in (*STEPS, "total"):
            print(f"{s:14s} p50 {res[f'{s}_p50_us']:8.1f} µs  p99 {res[f'{s}_p99_us']:8.1f} µs")
    print(json.dumps(res))
    return 0

