"""Routing at fleet scale, simulated: the router's real KVIndex and kv_choice decision (router/kv/index.py,
router/kv/choice.py) driven by a simulated fleet, no model, no HTTP (bench/routing_sim_fleet.py).

- 1,000 prefill workers (default), each an L1 of --l1-pages (LRU, leaves first), one shared store of
  --store-pages (LRU; the writer whose write overflows it removes the oldest pages and says so);
- 16 router replicas, each with its own KVIndex fed by the same event streams: every worker's
  journal cuts a KVEventBatch (a real protobuf) every 50 ms, router r receives it
  delay_ms * (1 + r / routers) later; requests go to the routers round-robin (a Kubernetes Service);
  each router speculates the prompt it routed (until the worker's event confirms it);
- 100k conversations: turns per conversation ~ Zipf(2) (capped at 10), exponential think time
  between turns, each turn the previous prompt plus 1-4 pages, behind one of 8 shared system
  prompts; worker restarts (a new epoch, an empty snapshot);
- loads: a router's load of a worker is queued + running from its last batch plus the requests this
  router sent it since that batch was cut; FIFO service (2 ms + 0.5 ms per computed page + 0.05 ms
  per page read from the store).

Variants on the same requests: `oracle` (replicas sharing one index that knows every cache
exactly, at once; the same decision, the same loads as the precise replicas, so the difference
is the cache knowledge alone), `precise` (the replicas above), and for contrast today's guess-based
router/policies.py CacheAware, one per replica (`guess`). Its decision is O(workers) in Python,
so the contrast runs on a slice of the fleet (--contrast-scale of the workers and conversations,
the same per-worker rate and cache sizes), with its own oracle and precise runs.

Reported: hit rate = pages reused (L1 + store) / pages an earlier request computed, and its ratio
to the oracle's; router CPU per decision (choose_prefill + speculate, p50/p99 µs, perf_counter_ns;
the index's event application separately, per batch), twice: every decision of the 16 replicas
above, and (`replica`) router 0's decisions in a run where it keeps an index of its own and the
other 15 replicas share one. NOTE: 16 indexes in one process are 16 times the memory a deployed
replica walks (each is its own process), and every structure is cold by the time its router's turn
comes: the same event batches cost several times as much to apply as with one index (the control,
`apply_us_per_batch` of both runs). The `replica` run keeps 2 indexes in the process, so it is
still the more pessimistic of the two for a deployed replica; index memory (the index's own estimate and
tracemalloc of an index rebuilt from the final snapshots); event bytes/s per worker (the deltas'
ByteSize) and snapshot bytes; linearity: the same at --linearity capacities (x0.5, x1, x2 by
default, on a smaller fleet). `--fast`: a small run for tests. `--json`: one JSON line last.

    python bench/routing_sim.py [--workers 1000] [--routers 16] [--conversations 100000] [--seed 0] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import sys
import time
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # NOTE: first: bench/engine.py would shadow the engine package

from bench.routing_sim_fleet import (
    Fleet,
    GuessRouter,
    OracleRouter,
    PreciseRouter,
    Prompts,
    SimConfig,
    make_requests,
)
from proto.pdorch.v1.worker_pb2 import KVEventBatch
from router.kv.index import KVIndex

ROUTERS = {"precise": PreciseRouter, "guess": GuessRouter}


def simulate(cfg: SimConfig, kind: str, requests) -> dict:
    """Run the requests through one variant; its numbers."""
    fleet = Fleet(cfg)
    addrs = [w.address for w in fleet.workers]
    slot = {a: i for i, a in enumerate(addrs)}
    now = [0.0]
    oracle = kind == "oracle"
    clock = lambda: now[0]
    exact = KVIndex(cfg.speculative_ttl_s, clock) if oracle else None
    if kind == "replica":  # router 0 timed with an index of its own; the others share one (see run())
        shared = PreciseRouter(cfg, addrs, clock)
        routers = [PreciseRouter(cfg, addrs, clock)] + [shared] * (cfg.routers - 1)
    else:
        routers = [OracleRouter(cfg, addrs, clock, exact) if oracle else ROUTERS[kind](cfg, addrs, clock)
                   for _ in range(cfg.routers)]
    fed = [r for r, router in enumerate(routers) if routers.index(router) == r]  # each index fed once
    timed = routers[0] if kind == "replica" else None  # None: every decision is timed
    for w in fleet.workers:  # subscribe: an empty snapshot of each worker
        b = fleet.snapshot(w, as_proto=False)
        if exact is not None:
            exact.apply(w.address, b)
            exact.set_live(w.address, True)
        for r in fed:
            routers[r].deliver(w.address, b, 0.0)
    proto = kind in ("precise", "replica")  # router 0 reads the protobufs
    rng = np.random.default_rng(cfg.seed + 1)
    duration = requests[-1].t if requests else 0.0
    restarts = sorted(zip(rng.uniform(0, duration, cfg.restarts), rng.integers(0, cfg.workers, cfg.restarts)))
    delays = [cfg.delay_ms / 1000 * (1 + r / len(routers)) for r in range(len(routers))]
    batch_s = cfg.batch_ms / 1000
    next_tick, ri = batch_s, 0
    prompts = Prompts(cfg)
    reusable = reused = from_l1 = from_store = 0
    decision_ns, decision_cpu_ns, reasons = [], [], {}
    delta_bytes = batches = 0

    def publish(w, batch, t: float) -> None:
        if exact is not None:
            exact.apply(w.address, batch)
        plain = _plain(batch) if proto else batch
        for r in fed:
            # NOTE: router 0 reads the protobuf (its apply time is the one reported); the others get
            # its fields read once: reading a repeated string field makes new str objects every time
            routers[r].queue.append((t + delays[r], w.address, batch if r == 0 else plain, t))

    gc.collect()
    gc.disable()  # NOTE: the simulator's own heap (fleet, queued batches) would charge its GC pauses to decisions
    for k, req in enumerate(requests):
        t = req.t
        while next_tick <= t:
            fleet.complete_until(next_tick)
            for w in fleet.workers:
                if w.dirty:
                    b = fleet.cut(w, proto)
                    if kind == "precise":
                        delta_bytes += b.ByteSize()
                    batches += 1
                    publish(w, b, next_tick)
            next_tick += batch_s
        while ri < len(restarts) and restarts[ri][0] <= t:
            w = fleet.workers[int(restarts[ri][1])]
            w.restart()
            publish(w, fleet.snapshot(w, proto), float(restarts[ri][0]))
            ri += 1
        fleet.complete_until(t)
        now[0] = t
        router = routers[k % len(routers)]
        q = router.queue
        while q and q[0][0] <= t:
            _, a, b, cut_t = q.popleft()
            router.deliver(a, b, cut_t)
        hashes = prompts.hashes(req.conv, req.pages)
        c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
        addr, why = router.choose(hashes)
        if timed is None or router is timed:
            decision_ns.append(time.perf_counter_ns() - t0)
            decision_cpu_ns.append(time.thread_time_ns() - c0)
        router.routed(addr)
        reasons[why] = reasons.get(why, 0) + 1
        i = slot[addr]
        l1, st = fleet.serve(i, hashes, t)
        if exact is not None:  # the oracle learns at once (the replicas' loads still come with the batch cuts)
            exact.apply(addr, fleet.cut(fleet.workers[i], False))
        r_ok = prompts.reusable(req.conv)
        reusable += r_ok
        reused += min(l1 + st, r_ok)
        from_l1 += l1
        from_store += st
        prompts.done(req)
    gc.enable()
    for router in map(routers.__getitem__, fed):  # the last events in flight
        while router.queue:
            _, a, b, cut_t = router.queue.popleft()
            router.deliver(a, b, cut_t)
    ns, cpu = np.array(decision_ns or [0]), np.array(decision_cpu_ns or [0])
    pages = sum(len(w.l1) for w in fleet.workers)
    out = {
        "kind": kind, "requests": len(requests), "sim_seconds": round(duration, 2),
        "hit_rate": round(reused / reusable, 4) if reusable else None,
        "l1_pages_per_request": round(from_l1 / max(1, len(requests)), 2),
        "store_pages_per_request": round(from_store / max(1, len(requests)), 2),
        "decision_us_p50": round(float(np.percentile(ns, 50)) / 1000, 1),
        "decision_us_p99": round(float(np.percentile(ns, 99)) / 1000, 1),
        # the same on the thread's CPU clock: without the time this process waited for a core
        "decision_cpu_us_p50": round(float(np.percentile(cpu, 50)) / 1000, 1),
        "decision_cpu_us_p99": round(float(np.percentile(cpu, 99)) / 1000, 1),
        "reasons": reasons, "fleet_l1_pages": pages, "fleet_store_pages": len(fleet.store),
    }
    if proto:  # router 0's: it reads the protobufs
        out["apply_us_per_batch"] = round(routers[0].apply_ns / max(1, routers[0].applied) / 1000, 2)
    if kind == "precise":
        st = routers[0].index.stats()
        out["index"] = {k: st[k] for k in ("l1_entries", "store_pages", "speculative_live", "speculative_confirmed",
                                           "speculative_expired", "memory_bytes")}
        out["batches"] = batches
        out["event_bytes_per_s_per_worker"] = round(delta_bytes / max(duration, 1e-9) / cfg.workers, 1)
        snaps = [fleet.snapshot(w) for w in fleet.workers]
        out["snapshot_bytes_per_worker"] = round(sum(s.ByteSize() for s in snaps) / len(snaps), 1)
        del routers, router, q
        out["index"]["tracemalloc_bytes"] = traced_index_bytes(snaps)
    return out


def _plain(batch: KVEventBatch) -> SimpleNamespace:
    return SimpleNamespace(worker_id=batch.worker_id, epoch=batch.epoch, seq=batch.seq, snapshot=batch.snapshot,
                           l1_stored=list(batch.l1_stored), l1_removed=list(batch.l1_removed),
                           store_written=list(batch.store_written), store_removed=list(batch.store_removed),
                           free_pages=batch.free_pages, queued_requests=batch.queued_requests,
                           running_requests=batch.running_requests, page_size=batch.page_size)


def traced_index_bytes(snaps: list) -> int:
    """tracemalloc's count of an index rebuilt from the workers' snapshots (the check on the estimate)."""
    gc.collect()  # NOTE: the routers' interned hashes must be gone, or the new index shares them
    tracemalloc.start()
    idx = KVIndex()
    for s in snaps:
        idx.apply(s.worker_id, s)
    del s
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del idx
    return traced


def run(cfg: SimConfig, contrast_scale: float, linearity: list[float], log) -> dict:
    t0 = time.monotonic()
    reqs = make_requests(cfg)
    log(f"{len(reqs)} requests over {reqs[-1].t:.1f} simulated s, {cfg.workers} workers, {cfg.routers} routers")
    res = {"config": dataclasses.asdict(cfg)}
    for kind in ("oracle", "precise"):
        s = time.monotonic()
        res[kind] = simulate(cfg, kind, reqs)
        log(f"  {kind:8s} hit {res[kind]['hit_rate']}  decision p50 {res[kind]['decision_us_p50']} µs  "
            f"p99 {res[kind]['decision_us_p99']} µs  ({time.monotonic() - s:.0f} s)")
    res["precise_over_oracle"] = round(res["precise"]["hit_rate"] / res["oracle"]["hit_rate"], 4)
    if cfg.routers > 1:  # the decision as one replica's own process sees it (the module docstring)
        s = time.monotonic()
        r = simulate(cfg, "replica", reqs)
        res["replica"] = {k: r[k] for k in ("hit_rate", "decision_us_p50", "decision_us_p99", "decision_cpu_us_p50",
                                            "decision_cpu_us_p99", "apply_us_per_batch")}
        log(f"  replica  decision p50 {r['decision_us_p50']} µs  p99 {r['decision_us_p99']} µs, apply "
            f"{r['apply_us_per_batch']} µs per batch (all replicas in one process: "
            f"{res['precise']['apply_us_per_batch']})  ({time.monotonic() - s:.0f} s)")
    small = dataclasses.replace(cfg, workers=max(2, round(cfg.workers * contrast_scale)),
                                conversations=max(10, round(cfg.conversations * contrast_scale)),
                                store_pages=max(1, round(cfg.store_pages * contrast_scale)),
                                restarts=max(1, round(cfg.restarts * contrast_scale)))
    sreqs = make_requests(small) if small != cfg else reqs
    contrast = {"workers": small.workers, "conversations": small.conversations}
    for kind in ("oracle", "precise", "guess"):
        if small == cfg and kind != "guess":
            contrast[kind] = {k: res[kind][k] for k in ("hit_rate", "decision_us_p50", "decision_us_p99",
                                                        "decision_cpu_us_p99")}
            continue
        s = time.monotonic()
        r = simulate(small, kind, sreqs)
        contrast[kind] = {k: r[k] for k in ("hit_rate", "decision_us_p50", "decision_us_p99", "decision_cpu_us_p99",
                                            "reasons")}
        log(f"  contrast {kind:8s} ({small.workers} workers) hit {r['hit_rate']}  "
            f"decision p99 {r['decision_us_p99']} µs  ({time.monotonic() - s:.0f} s)")
    for kind in ("precise", "guess"):
        contrast[f"{kind}_over_oracle"] = round(contrast[kind]["hit_rate"] / contrast["oracle"]["hit_rate"], 4)
    res["contrast"] = contrast
    res["linearity"] = []
    base = dataclasses.replace(small, routers=2)
    for f in linearity:
        c = dataclasses.replace(base, l1_pages=round(cfg.l1_pages * f), store_pages=round(small.store_pages * f))
        r = simulate(c, "precise", make_requests(c))
        ix = r["index"]
        held = ix["l1_entries"] + ix["store_pages"]
        row = {"capacity_factor": f, "l1_pages": c.l1_pages, "store_pages": c.store_pages, "pages_held": held,
               "memory_bytes": ix["memory_bytes"], "tracemalloc_bytes": ix["tracemalloc_bytes"],
               "bytes_per_page": round(ix["tracemalloc_bytes"] / max(1, held), 1),
               "event_bytes_per_s_per_worker": r["event_bytes_per_s_per_worker"],
               "snapshot_bytes_per_worker": r["snapshot_bytes_per_worker"], "hit_rate": r["hit_rate"]}
        res["linearity"].append(row)
        log(f"  linearity x{f}: {held} pages held, {ix['tracemalloc_bytes'] / 1e6:.1f} MB traced "
            f"({row['bytes_per_page']} B/page), estimate {ix['memory_bytes'] / 1e6:.1f} MB, "
            f"events {row['event_bytes_per_s_per_worker']} B/s/worker, snapshot {row['snapshot_bytes_per_worker']} B")
    res["wall_s"] = round(time.monotonic() - t0, 1)
    return res


def summary(res: dict) -> dict:
    p, o, c = res["precise"], res["oracle"], res["contrast"]
    return {
        "workers": res["config"]["workers"], "routers": res["config"]["routers"],
        "conversations": res["config"]["conversations"], "requests": p["requests"],
        "oracle_hit_rate": o["hit_rate"], "precise_hit_rate": p["hit_rate"],
        "precise_over_oracle": res["precise_over_oracle"],
        "decision_us_p50": p["decision_us_p50"], "decision_us_p99": p["decision_us_p99"],
        "decision_cpu_us_p50": p["decision_cpu_us_p50"], "decision_cpu_us_p99": p["decision_cpu_us_p99"],
        "apply_us_per_batch": p["apply_us_per_batch"],
        "replica": res.get("replica"),
        "index_memory_bytes": p["index"]["memory_bytes"], "index_tracemalloc_bytes": p["index"]["tracemalloc_bytes"],
        "index_pages": p["index"]["l1_entries"] + p["index"]["store_pages"],
        "event_bytes_per_s_per_worker": p["event_bytes_per_s_per_worker"],
        "snapshot_bytes_per_worker": p["snapshot_bytes_per_worker"],
        "speculative": {k: p["index"][k] for k in ("speculative_confirmed", "speculative_expired")},
        "reasons": p["reasons"],
        "contrast_workers": c["workers"], "contrast_oracle_hit_rate": c["oracle"]["hit_rate"],
        "contrast_precise_over_oracle": c["precise_over_oracle"], "contrast_guess_over_oracle": c["guess_over_oracle"],
        "guess_decision_us_p99": c["guess"]["decision_us_p99"],
        "linearity": res["linearity"], "wall_s": res["wall_s"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    d = SimConfig()
    ap.add_argument("--workers", type=int, default=d.workers)
    ap.add_argument("--routers", type=int, default=d.routers)
    ap.add_argument("--conversations", type=int, default=d.conversations)
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--l1-pages", type=int, default=d.l1_pages, help="L1 pages per worker")
    ap.add_argument("--store-pages", type=int, default=d.store_pages, help="store pages (shared)")
    ap.add_argument("--restarts", type=int, default=d.restarts, help="worker restarts over the run")
    ap.add_argument("--contrast-scale", type=float, default=0.1,
                    help="the guess-based contrast's share of the workers and conversations")
    ap.add_argument("--linearity", default="0.5,1,2", help="capacity factors of the linearity runs ('' : none)")
    ap.add_argument("--fast", action="store_true", help="a small run (tests): 50 workers, 4 routers, 3,000 conversations")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = ap.parse_args(argv)
    cfg = SimConfig(workers=args.workers, routers=args.routers, conversations=args.conversations, seed=args.seed,
                    l1_pages=args.l1_pages, store_pages=args.store_pages, restarts=args.restarts)
    contrast = args.contrast_scale
    if args.fast:
        cfg = dataclasses.replace(cfg, workers=50, routers=4, conversations=3000, restarts=3,
                                  store_pages=cfg.store_pages * 50 // cfg.workers)
        contrast = 1.0
    factors = [float(f) for f in args.linearity.split(",") if f]

    def log(msg: str) -> None:
        if not args.json:
            print(msg, flush=True)

    res = run(cfg, contrast, factors, log)
    s = summary(res)
    if not args.json:
        print(f"\nhit rate: precise {s['precise_hit_rate']} / oracle {s['oracle_hit_rate']} = "
              f"{s['precise_over_oracle']} ({s['routers']} routers, target >= 0.95); guess-based "
              f"{s['contrast_guess_over_oracle']} of its oracle ({s['contrast_workers']} workers)")
        print(f"decision: p50 {s['decision_us_p50']} µs, p99 {s['decision_us_p99']} µs at {s['workers']} workers "
              f"(target p99 < 200); guess-based p99 {s['guess_decision_us_p99']} µs at {s['contrast_workers']}")
        if s["replica"]:
            print(f"decision in a replica's own index: p50 {s['replica']['decision_us_p50']} µs, "
                  f"p99 {s['replica']['decision_us_p99']} µs")
        print(f"index: {s['index_pages']} pages, estimate {s['index_memory_bytes'] / 1e6:.1f} MB, "
              f"tracemalloc {s['index_tracemalloc_bytes'] / 1e6:.1f} MB; events {s['event_bytes_per_s_per_worker']} "
              f"B/s per worker, snapshot {s['snapshot_bytes_per_worker']} B per worker")
    print(json.dumps(s))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
