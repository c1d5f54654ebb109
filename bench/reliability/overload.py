"""Overload: `--factor` (4) x more concurrent requests than the cluster admits. Every request must end
served (200, within its deadline) or rejected quickly (429 / 503), none lost; admitted requests keep
their latency.

    python -m bench.reliability.overload [--factor 4] [--waves 3] [--json]
    pdorch bench overload ...                   (the same)

Starts `pdorch serve` with small admission bounds (OVERLOAD_SETS, then --config / --set, which win),
so 4x is cheap: admission = the smallest of the router's in-flight bound, the decode workers' running +
queued bounds and the prefill workers' queue bounds. Each wave sends `admission` concurrent requests
(1x) and then `factor x admission` (overload); waves alternate so both loads see the same background
noise. Every request is a fresh prompt of the same size (random ids: no cache hit anywhere), greedy,
`ignore_eos`, streamed, so 1x and overload latencies compare like for like. Outcomes are counted per
request: served / 429 / 503 / 504 / other / client timeout (no answer by the deadline + slack); after
the run every worker must be idle with every page back and its pool intact.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# NOTE: first, unconditionally: ahead of this script's own folder, whose modules must not shadow the project's.
sys.path.insert(0, str(ROOT))

from bench.multiturn.client import HttpBackend
from bench.multiturn.conversation import Prompt
from bench.multiturn.facts import commit
from bench.multiturn.stats import percentile, ratio
from bench.reliability.soak import report as rep
from pdorch.config_loader import add_config_args

# NOTE: the router's in-flight bound is the gate that binds: decode.max_queued_requests bounds only the
# requests waiting for KV pages (decode_node/admission.py); with pages to spare the decode worker takes
# every request the router passes on and queues it for a batch slot. So the router's bound is set to
# the decode batch (4) + 4 waiting, and 1x = 8 concurrent requests.
OVERLOAD_SETS = ["decode.max_running_requests=4", "decode.max_queued_requests=4", "router.max_queued_requests=8",
                 "prefill.max_queued_requests=8", "router.request_timeout_s=60"]
OUTCOMES = ("served", "429", "503", "504", "other", "client_timeout")
CLIENT_SLACK_S = 15.0  # past the router's deadline: the router had its chance to answer 504


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pdorch bench overload", description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--factor", type=int, default=4, help="overload = this many times the admission (default 4)")
    p.add_argument("--admission", type=int, default=0,
                   help="concurrent requests at 1x (default: the smallest admission bound of the config)")
    p.add_argument("--waves", type=int, default=3, help="1x + overload wave pairs (default 3)")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-dir", help="component logs of the cluster (default: a temp dir)")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    add_config_args(p)
    return p


def admission(cfg, num_prefill: int = 1, num_decode: int = 1) -> int:
    return min(cfg.router.max_queued_requests,
               num_decode * (cfg.decode.max_running_requests + cfg.decode.max_queued_requests),
               num_prefill * cfg.prefill.max_queued_requests)


def classify(error: str | None) -> str:
    """Outcome of one reply from its error text (HttpBackend: "HTTP 429: {...}", a stream's error event,
    or an httpx exception)."""
    if error is None:
        return "served"
    m = re.match(r"HTTP (\d+):", error)
    return m.group(1) if m and m.group(1) in OUTCOMES else "other"


def gate(error: str) -> str:
    """Which bound rejected it, from the message (router/http/service.py vs router/dispatch/dispatch.py)."""
    return "router" if "in flight" in error else "workers" if "capacity" in error else "other"


async def wave(backend: HttpBackend, n: int, first: int, tok_range: int, args, deadline_s: float) -> list[dict]:
    """n concurrent requests, each a fresh prompt (clients first.. first+n-1: unique request ids)."""
    rng = random.Random(f"overload:{args.seed}:{first}")
    prompts = [Prompt(client=first + i, round=0, ids=[rng.randrange(1000, tok_range) for _ in range(args.prompt_tokens)],
                      messages=None, ideal_tokens=0, previous_context_pages=0) for i in range(n)]

    async def one(p: Prompt) -> dict:
        t0 = time.monotonic()
        try:
            reply = await asyncio.wait_for(backend.send(p), deadline_s + CLIENT_SLACK_S)
        except TimeoutError:
            return {"outcome": "client_timeout", "latency_s": time.monotonic() - t0, "ttft_s": None, "error": None}
        e2e = time.monotonic() - t0
        outcome = classify(reply.error)
        if outcome == "served" and reply.completion_tokens != args.output_tokens:
            outcome = "other"  # a 200 that lost tokens is not served
        return {"outcome": outcome, "latency_s": e2e, "ttft_s": reply.ttft_s, "error": reply.error,
                "late": outcome == "served" and e2e > deadline_s}

    return await asyncio.gather(*(one(p) for p in prompts))


def load_summary(results: list[dict]) -> dict:
    counts = {o: sum(r["outcome"] == o for r in results) for o in OUTCOMES}
    served = [r for r in results if r["outcome"] == "served"]
    rejected = [r for r in results if r["outcome"] in ("429", "503")]
    gates: dict[str, int] = {}
    for r in rejected:
        gates[gate(r["error"])] = gates.get(gate(r["error"]), 0) + 1
    ttft = [r["ttft_s"] for r in served if r["ttft_s"] is not None]
    e2e = [r["latency_s"] for r in served]
    rej = [r["latency_s"] for r in rejected]
    return {"requests": len(results), "outcomes": counts, "served_late": sum(r.get("late", False) for r in served),
            "rejected_by": gates,
            "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
            "e2e_p50_s": percentile(e2e, 50), "e2e_p99_s": percentile(e2e, 99),
            "reject_p50_s": percentile(rej, 50), "reject_p99_s": percentile(rej, 99),
            "examples": sorted({r["error"][:160] for r in results if r["error"] and r["outcome"] not in
                                ("429", "503")})[:5]}


async def run(url: str, cfg, args, adm: int, vocab: int) -> tuple[list[dict], list[dict]]:
    deadline_s = cfg.router.request_timeout_s
    n_over = args.factor * adm
    backend = HttpBackend(url, "sglang", cfg.model.served_name, args.output_tokens, deadline_s + CLIENT_SLACK_S,
                          n_over, cfg.router.api_key)
    base, over = [], []
    try:
        first = 0
        for _ in range(args.waves):
            base += await wave(backend, adm, first, vocab, args, deadline_s)
            over += await wave(backend, n_over, first + adm, vocab, args, deadline_s)
            first += adm + n_over
    finally:
        await backend.close()
    return base, over


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    say = rep.sayer(args.json)
    t_start = time.monotonic()
    cluster, sets = rep.start_cluster(args, OVERLOAD_SETS, "pdorch bench overload", say)
    adm = args.admission or admission(cluster.cfg)
    addresses = rep.worker_addresses(cluster.cfg, 1, 1)
    try:
        baseline, _ = rep.wait_idle(cluster.cfg, addresses)
        from bench.multiturn.facts import model_facts
        vocab = model_facts(None, cluster.cfg)[0].vocab_size
        say(f"admission {adm}; {args.waves} waves of {adm} (1x) and {args.factor * adm} ({args.factor}x) requests")
        base, over = asyncio.run(run(cluster.url, cluster.cfg, args, adm, vocab))
        end_states, idle_s = rep.wait_idle(cluster.cfg, addresses)
    finally:
        cluster.stop()
    b, o = load_summary(base), load_summary(over)
    leaked = rep.leaked_pages(baseline, end_states)
    out = {"admission": adm, "factor": args.factor, "waves": args.waves, "deadline_s": cluster.cfg.router.request_timeout_s,
           "load_1x": b, "overload": o,
           "ttft_p50_ratio": ratio(o["ttft_p50_s"], b["ttft_p50_s"]), "ttft_p99_ratio": ratio(o["ttft_p99_s"], b["ttft_p99_s"]),
           "e2e_p50_ratio": ratio(o["e2e_p50_s"], b["e2e_p50_s"]), "e2e_p99_ratio": ratio(o["e2e_p99_s"], b["e2e_p99_s"]),
           "lost": sum(x["outcomes"]["other"] + x["outcomes"]["client_timeout"] + x["served_late"] for x in (b, o)),
           "leaked_pages": sum(v for v in leaked.values() if v is not None) if None not in leaked.values() else None,
           "integrity_ok": all(s.get("integrity_ok") for s in end_states.values()), "idle_wait_s": round(idle_s, 1)}
    print(f"\npdorch bench overload: admission {adm}, {args.factor}x = {args.factor * adm} concurrent, "
          f"{args.waves} waves, deadline {out['deadline_s']:g} s ({commit()})")
    print(f"{'load':<9} {'sent':>5} " + " ".join(f"{k:>8}" for k in OUTCOMES) +
          f" {'TTFT p50/p99 s':>16} {'e2e p50/p99 s':>16} {'reject p50/p99 ms':>18}")
    for name, x in (("1x", b), (f"{args.factor}x", o)):
        def pair(a, c, k=1.0):
            return "-" if a is None else f"{a * k:.3g}/{c * k:.3g}"
        print(f"{name:<9} {x['requests']:>5} " + " ".join(f"{x['outcomes'][k]:>8}" for k in OUTCOMES) +
              f" {pair(x['ttft_p50_s'], x['ttft_p99_s']):>16} {pair(x['e2e_p50_s'], x['e2e_p99_s']):>16}"
              f" {pair(x['reject_p50_s'], x['reject_p99_s'], 1000):>18}")
    print(f"rejected by {o['rejected_by']}; served late {b['served_late'] + o['served_late']}; lost {out['lost']}; "
          f"overload / 1x: TTFT p50 {out['ttft_p50_ratio']}, p99 {out['ttft_p99_ratio']}, "
          f"e2e p50 {out['e2e_p50_ratio']}, p99 {out['e2e_p99_ratio']}")
    print(f"leaked pages {out['leaked_pages']} {leaked}, integrity {out['integrity_ok']}")
    for e in b["examples"] + o["examples"]:
        print(f"  unexpected: {e}")
    if args.json:
        out.update(bench="overload", prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens, sets=sets,
                   pools_end=end_states, commit=commit(), elapsed_s=round(time.monotonic() - t_start, 1))
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
