"""Mid-stream failover: kill -9 the decode worker serving a stream; time until the client's next token.

    python -m bench.reliability.failover [--kills 5] [--kill-after 20] [--max-tokens 96] [--json]

Starts `pdorch serve` (1 prefill + 3 decode workers, the store on, decode.offload_generated_kv on,
router.mid_stream_failover auto = on) as a user starts it. Each trial streams one greedy /generate
request, and after --kill-after streamed tokens kills -9 the decode worker serving it (the router's
/workers says which). Measured at the client: the time from the kill to the next streamed token (the
failover gap), against the median gap between tokens before the kill. Then the same request runs
uninterrupted: its output must be equal. The launcher restarts the killed worker; the next trial waits
until every decode worker is healthy again, so the router can always pick another one.

NOTE: `pdorch serve` gives every worker the same store section, so decode workers contribute memory
to the store too, and Mooncake may keep an offloaded page in the writer's own segment: such pages die
with the worker and the resumed prefill computes them again (computed_tokens_per_failover). Decode
workers that are pure store clients (store.global_segment_size_mb: 0) keep every offloaded page.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import signal
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# NOTE: first, unconditionally: ahead of this script's own folder, whose modules must not shadow the project's.
sys.path.insert(0, str(ROOT))

import httpx

from bench.multiturn.cluster import ServeCluster, port_overrides
from bench.multiturn.facts import commit
from bench.reliability.soak import report as rep
from pdorch.config_loader import add_config_args, default_config_path

NUM_DECODE = 3
FAILOVER_SETS = ["store.enabled=true", "decode.offload_generated_kv=true", "router.mid_stream_failover=auto"]
HEALTHY_TIMEOUT_S = 300.0  # a restarted worker loads the model again (backoff grows with repeated kills)
PROMPTS = ["Once upon a time, in a small village by the sea, there lived an old lighthouse keeper who",
           "The history of the printing press begins in the fifteenth century, when",
           "To bake a loaf of bread at home, you first need to",
           "The mountain trail climbed steeply through the pine forest, and the hikers",
           "In the year 2150, the first city on Mars was finally"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.reliability.failover", description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--kills", type=int, default=5, help="trials, one kill each (default 5)")
    p.add_argument("--kill-after", type=int, default=20, help="streamed tokens before the kill (default 20)")
    p.add_argument("--max-tokens", type=int, default=96, help="tokens per request (default 96)")
    p.add_argument("--log-dir", help="component logs of the cluster (default: a temp dir)")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    add_config_args(p)
    return p


def workers(url: str) -> dict[str, dict]:
    return {w["address"]: w for w in httpx.get(url + "/workers", timeout=30).json()["workers"]}


def wait_decodes_healthy(url: str, n: int) -> None:
    deadline = time.monotonic() + HEALTHY_TIMEOUT_S
    while sum(1 for w in workers(url).values() if w["role"] == "decode" and w["healthy"]) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"fewer than {n} healthy decode workers after {HEALTHY_TIMEOUT_S:.0f} s")
        time.sleep(0.5)


def stream(url: str, body: dict, kill=None, kill_after: int = 0) -> dict:
    """One /generate stream; `kill()` runs once `kill_after` tokens arrived and returns the kill time."""
    arrivals, last, killed_at = [], None, None
    with httpx.stream("POST", url + "/generate", json=body, timeout=300) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            ev = json.loads(line[6:])
            if "error" in ev:
                raise RuntimeError(f"the stream failed: {ev['error']['message']}")
            arrivals.append((time.monotonic(), len(ev["output_ids"])))
            last = ev
            if kill is not None and killed_at is None and len(ev["output_ids"]) >= kill_after:
                if ev["meta_info"]["finish_reason"]:
                    raise RuntimeError("the request finished before the kill: raise --max-tokens")
                killed_at = kill()
    out = {"output_ids": last["output_ids"], "text": last["text"]}
    if killed_at is not None:
        before = [t for t, _ in arrivals if t < killed_at]
        after = [t for t, _ in arrivals if t > killed_at]
        out["gap_s"] = after[0] - killed_at if after else None
        out["itl_s"] = statistics.median(b - a for a, b in itertools.pairwise(before)) if len(before) > 1 else None
    return out


def killer(cluster: ServeCluster, url: str, cfg):
    """A function that kill -9s the decode worker the router has a stream open on; returns when."""
    def kill() -> float:
        serving = [a for a, w in workers(url).items() if w["role"] == "decode" and w["in_flight"] == 1]
        if len(serving) != 1:
            raise RuntimeError(f"expected one decode worker with the stream open, got {serving}")
        index = int(serving[0].rpartition(":")[2]) - cfg.decode.port
        pid = cluster.refresh()[f"decode-{index}"]
        os.kill(pid, signal.SIGKILL)
        return time.monotonic()
    return kill


def router_counters(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=30).text

    def value(sample: str) -> float:
        m = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.MULTILINE)
        return float(m.group(1)) if m else 0.0
    return {"resumed": value('pdorch_router_failovers_total{outcome="resumed"}'),
            "failed": value('pdorch_router_failovers_total{outcome="failed"}'),
            "computed": value("pdorch_router_failover_computed_tokens_total"),
            "store": value('pdorch_router_failover_cached_tokens_total{tier="store"}'),
            "gap_sum": value("pdorch_router_failover_gap_seconds_sum"),
            "gap_count": value("pdorch_router_failover_gap_seconds_count")}


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    say = rep.sayer(args.json)
    args.config = args.config or str(default_config_path())
    sets = FAILOVER_SETS + args.config_overrides + port_overrides(1, NUM_DECODE)
    cluster = ServeCluster(args.config, sets, 1, NUM_DECODE, args.log_dir).start()
    say(f"cluster ready at {cluster.url} (logs in {cluster.log_dir}); --set {' '.join(sets)}")
    trials = []
    try:
        kill = killer(cluster, cluster.url, cluster.cfg)
        for i in range(args.kills):
            wait_decodes_healthy(cluster.url, NUM_DECODE)
            body = {"text": PROMPTS[i % len(PROMPTS)] + f" (story {i})", "stream": True,
                    "sampling_params": {"temperature": 0, "max_new_tokens": args.max_tokens, "ignore_eos": True}}
            killed = stream(cluster.url, body, kill, args.kill_after)
            reference = stream(cluster.url, body)
            killed["equal"] = killed["output_ids"] == reference["output_ids"] and killed["text"] == reference["text"]
            trials.append(killed)
            say(f"kill {i + 1}: gap {killed['gap_s']:.3f} s (ITL before {killed['itl_s'] * 1000:.1f} ms), "
                f"output equal to the uninterrupted run: {killed['equal']}")
        counters = router_counters(cluster.url)
    finally:
        cluster.stop()
    gaps = [t["gap_s"] for t in trials]
    itl = statistics.median(t["itl_s"] for t in trials)
    n = max(counters["resumed"], 1)
    out = {"kills": len(trials), "resumed": int(counters["resumed"]), "failed": int(counters["failed"]),
           "equal_outputs": sum(t["equal"] for t in trials), "failover_gap_median_s": round(statistics.median(gaps), 4),
           "failover_gap_max_s": round(max(gaps), 4), "failover_gap_s": [round(g, 4) for g in gaps],
           "itl_median_s": round(itl, 4), "gap_over_itl_ratio": round(statistics.median(gaps) / itl, 1),
           "router_gap_mean_s": round(counters["gap_sum"] / max(counters["gap_count"], 1), 4),
           "computed_tokens_per_failover": round(counters["computed"] / n, 1),
           "store_tokens_per_failover": round(counters["store"] / n, 1)}
    print(f"\nfailover: {out['kills']} kills after {args.kill_after} tokens, {out['resumed']} resumed, "
          f"{out['failed']} failed, {out['equal_outputs']} outputs equal to the uninterrupted run ({commit()})")
    print(f"kill -> next token: median {out['failover_gap_median_s']:.3f} s, max {out['failover_gap_max_s']:.3f} s "
          f"(ITL median {itl * 1000:.1f} ms; router: break -> resumed first token {out['router_gap_mean_s']:.3f} s mean)")
    print(f"per failover: {out['computed_tokens_per_failover']} tokens computed again, "
          f"{out['store_tokens_per_failover']} loaded from the store")
    if args.json:
        out.update(bench="failover", kill_after=args.kill_after, max_tokens=args.max_tokens, sets=sets,
                   commit=commit())
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
