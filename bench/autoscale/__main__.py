"""python -m bench.autoscale (see bench/autoscale/__init__.py)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from bench.autoscale.arrivals import Shape
from bench.autoscale.run import compare


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pdorch bench autoscale", allow_abbrev=False,
                                     description="the planner vs fixed fleets on a simulated fleet")
    parser.add_argument("--json", action="store_true", help="print the whole result as JSON")
    parser.add_argument("--duration-s", type=float, default=Shape.duration_s)
    parser.add_argument("--base-rps", type=float, default=Shape.base_rps)
    parser.add_argument("--seed", type=int, default=Shape.seed)
    parser.add_argument("--max-prefill", type=int, default=4)
    parser.add_argument("--max-decode", type=int, default=8)
    parser.add_argument("--set", action="append", default=[], metavar="planner.KEY=VALUE",
                        help="a planner key for the planner in the bench (repeatable), e.g. planner.load_margin=0")
    args = parser.parse_args(argv)
    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("planner."):
            parser.error(f"--set {item!r}: expected planner.KEY=VALUE")
        overrides[key] = value
    shape = replace(Shape(), duration_s=args.duration_s, base_rps=args.base_rps, seed=args.seed)
    result = compare(shape, args.max_prefill, args.max_decode, planner_overrides=overrides)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    for f in result["fixed"]:
        print(f"fixed P={f['prefill']} D={f['decode']}: SLO met {f['slo_met_fraction']:.1%}, "
              f"{f['replica_seconds']:.0f} replica-s")
    p = result["planner"]
    print(f"planner: SLO met {p['slo_met_fraction']:.1%}, {p['replica_seconds']:.0f} replica-s, "
          f"{p['fleet_changes']} changes, max {p['replicas_max']}")
    o = result["oracle"]
    print(f"oracle (true load ahead): SLO met {o['slo_met_fraction']:.1%}, {o['replica_seconds']:.0f} replica-s "
          f"({result['oracle_cost_ratio']}x)")
    print(f"planner missed intervals: {p['missed']}")
    print(f"smallest fixed fleet meeting the SLOs: {result['smallest_fixed_meeting_slo']}")
    print(f"planner cost ratio: {result['planner_cost_ratio']} (goal <= 0.7): goal met {result['goal']['met']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
