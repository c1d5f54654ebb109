"""Scale-up and the hit rate: does a fleet that grows keep the hits a fixed fleet gets?

    python -m bench.scale_up_hits [--runs 3] [--json]
    pdorch bench scale-up-hits ...                  (the same)

Each run starts two stacks in turn (bench/scale_up_hits/stack.py: etcd, mooncake_master, a store
peer, a LocalFleet, the router; the tiny random-weights model) and sends both the same workload
(bench/scale_up_hits/workload.py): (a) `fixed`, 2 prefill + 2 decode from the start; (b)
`scale_up`, 1 + 1 grown to 2 + 2 between the phases `before` and `after`. Reported per variant and
phase, the median over the runs: the hit rate (and its L1 part), the old conversations' L1 hits
against their ideal, the second worker's share of requests per role, the prefill in-flight spread,
the policy's choices by reason (bench/scale_up_hits/run.py). The claim checked (`claim`): after the
join, (b)'s hit rate is not below (a)'s by more than --tolerance, and the new prefill worker got
requests but not more than its share of the new conversations.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.multiturn.facts import commit
from bench.scale_up_hits.run import run_once
from bench.scale_up_hits.stack import FleetStack
from bench.scale_up_hits.workload import PHASES, Workload
from pdorch.config import RouterConfig

VARIANTS = {"fixed": ((2, 2), False), "scale_up": ((1, 1), True)}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pdorch bench scale-up-hits", description=__doc__.split("\n")[0],
                                allow_abbrev=False)
    w = Workload()
    p.add_argument("--runs", type=int, default=3, help="runs of each variant; medians are reported (default 3)")
    p.add_argument("--old", type=int, default=w.old_conversations, help="conversations started before the join")
    p.add_argument("--new", type=int, default=w.new_conversations, help="conversations started after it")
    p.add_argument("--parallel", type=int, default=w.parallel, help="requests in flight at most")
    p.add_argument("--output-tokens", type=int, default=w.output_tokens, help="tokens per answer")
    p.add_argument("--tolerance", type=float, default=0.02, help="hit-rate points (b) may lose to (a) as noise")
    p.add_argument("--log-dir", help="the stacks' logs (default: a new temp dir)")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    return p


def median_phases(runs: list[dict]) -> dict:
    """Per phase, the median of each number over the runs (the run dicts' leaves)."""
    def med(values):
        if isinstance(values[0], dict):
            keys = sorted(set().union(*values))
            return {k: med([v.get(k, 0) for v in values]) for k in keys}
        values = [v for v in values if v is not None]
        return round(statistics.median(values), 4) if values else None
    return {phase: med([r["phases"][phase] for r in runs]) for phase in PHASES}


def claim(fixed: dict, scaled: dict, tolerance: float, threshold: int) -> dict:
    """After the join: (b) keeps (a)'s hit rate within `tolerance`; the new prefill worker is used;
    the prefill in-flight spread stays within the policy's bound (a prefix match is kept only while
    its worker is at most `threshold` busier: one more request lands on top of that at most)."""
    out = {}
    for phase in ("after", "later"):
        a, b = fixed[phase]["hit_rate"], scaled[phase]["hit_rate"]
        out[f"{phase}_hit_rate_not_below_fixed"] = b >= a - tolerance
    out["new_prefill_worker_used"] = scaled["after"]["new_worker_share"]["prefill"] > 0
    out["spread_within_bound"] = all(scaled[p]["spread"]["max_minus_min"] <= threshold + 1 for p in ("after", "later"))
    out["holds"] = all(out.values())
    return out


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.runs < 1 or args.old < 1 or args.new < 1 or args.parallel < 1:
        parser().error("--runs, --old, --new and --parallel must be >= 1")
    say = (lambda m: print(m, file=sys.stderr, flush=True)) if args.json else (lambda m: print(m, flush=True))
    from engine.prepare import make_tiny_model
    from engine.tokenizer import Tokenizer

    root = Path(args.log_dir or tempfile.mkdtemp(prefix="pdorch-scale-up-hits-"))
    model_dir = make_tiny_model(root / "model")
    tok = Tokenizer.from_dir(model_dir)
    w = dataclasses.replace(Workload(), old_conversations=args.old, new_conversations=args.new,
                            parallel=args.parallel, output_tokens=args.output_tokens)
    t0 = time.monotonic()
    runs: dict[str, list[dict]] = {k: [] for k in VARIANTS}
    for i in range(args.runs):
        for key, ((p, d), scale_up) in VARIANTS.items():
            say(f"[{key}] run {i + 1}/{args.runs}: starting {p}+{d}")
            with FleetStack(model_dir, p, d, log_dir=root / f"{key}-{i}", say=lambda m: None) as stack:
                runs[key].append(run_once(stack, w, tok, scale_up, say))
            say(f"[{key}] run {i + 1}: " + " ".join(f"{ph} {r['hit_rate']:.3f}"
                                                     for ph, r in runs[key][-1]["phases"].items()))
    medians = {k: median_phases(v) for k, v in runs.items()}
    threshold = RouterConfig().load_imbalance_threshold  # the stacks run the router's defaults
    result = {"bench": "scale_up_hits", "commit": commit(), "workload": dataclasses.asdict(w), "runs": args.runs,
              "medians": medians, "join_s": [r["join_s"] for r in runs["scale_up"]],
              "claim": claim(medians["fixed"], medians["scale_up"], args.tolerance, threshold), "per_run": runs,
              "seconds": round(time.monotonic() - t0, 1), "log_dir": str(root)}
    say(table(medians))
    say(f"claim: {result['claim']}")
    if args.json:
        print(json.dumps(result))
    return 0


def table(medians: dict) -> str:
    head = f"{'variant':<9} {'phase':<7} {'hit':>6} {'L1':>6} {'old L1/ideal':>12} {'new P':>6} {'new D':>6} " \
           f"{'spread':>6}  choices"
    rows = [head]
    for key, phases in medians.items():
        for phase, r in phases.items():
            share = r["new_worker_share"]
            rows.append(f"{key:<9} {phase:<7} {r['hit_rate']:>6.3f} {r['l1_hit_rate']:>6.3f} "
                        f"{r['old_l1_of_ideal'] if r['old_l1_of_ideal'] is not None else '-':>12} "
                        f"{share['prefill']:>6.2f} {share['decode']:>6.2f} {r['spread']['max_minus_min']:>6}  "
                        f"{r['choices']}")
    return "\n".join(rows)
