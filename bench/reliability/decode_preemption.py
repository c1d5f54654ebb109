"""Streams that outgrow the decode pool: preemption (decode_node/preemption.py) against the behaviour
before it, in one run.

    python -m bench.reliability.decode_preemption [--runs 3] [--pages 96] [--prompt-tokens 96] [--new-tokens 300]
                                      [--oversubscription 1.5,3] [--test-model llama3] [--json]

Starts one `pdorch serve` per variant (all alive together, on free ports; the decode pool is
--pages pages) and, per run and oversubscription x, sends round(x * pages / pages per stream) greedy
/generate streams at once (random prompt ids, ignore_eos), to each variant in turn (the same prompts;
a new set each run):

    on          the default config: preemption on, admission keeps back decode.growth_reserve
    off         decode.preemption=false, decode.growth_reserve=0: a running request that finds no
                page fails RESOURCE_EXHAUSTED (the behaviour before preemption)
    no_reserve  preemption on, decode.growth_reserve=0: what the reserve saves
    reserve=R   preemption on, decode.growth_reserve=R (its floor: R / 7, as 0.1 is to 0.7)

Per variant and x: delivered tokens/s (every token the clients received / the batch's wall time,
median over runs), goodput (the tokens of the streams that completed / wall time: a cut stream's
tokens are lost to its client), the fraction of streams that completed, preemptions per stream, and the paused
seconds of each preempted stream (meta_info.preempted_s) p50/p99 over all runs; per run the ratio
of each variant's throughput to `off`'s, and whether the streams that completed in two variants have
equal outputs (greedy: they must).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # NOTE: before the imports

import httpx

from bench.multiturn.cluster import ServeCluster, port_overrides
from bench.multiturn.facts import commit, test_model_dir
from bench.multiturn.stats import percentile
from engine.page_allocator import pages_for
from pdorch.config_loader import add_config_args, default_config_path
from pdorch.local_stack.hf_checkpoints import FAMILIES

VARIANTS = {"on": [], "off": ["decode.preemption=false", "decode.growth_reserve=0"],
            "no_reserve": ["decode.growth_reserve=0"]}
STREAM_TIMEOUT_S = 1800.0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.reliability.decode_preemption", description=__doc__.split("\n")[0],
                                allow_abbrev=False)
    p.add_argument("--runs", type=int, default=3, help="repetitions (default 3)")
    p.add_argument("--pages", type=int, default=96, help="decode.num_pages (default 96)")
    p.add_argument("--prompt-tokens", type=int, default=96, help="tokens per prompt (default 96)")
    p.add_argument("--new-tokens", type=int, default=300, help="tokens generated per stream (default 300)")
    p.add_argument("--oversubscription", default="1.5,3", help="streams' KV at their end / the pool (default 1.5,3)")
    p.add_argument("--variants", default="on,off,no_reserve", help=f"of {','.join(VARIANTS)}, reserve=R")
    p.add_argument("--test-model", choices=FAMILIES, help="serve the random-weights checkpoint of this family "
                   "(pdorch/local_stack/hf_checkpoints.py) instead of model.source")
    p.add_argument("--log-dir", help="component logs of the clusters (default: temp dirs)")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    add_config_args(p)
    return p


def variant_sets(name: str) -> list[str]:
    if name.startswith("reserve="):
        r = float(name.partition("=")[2])
        return [f"decode.growth_reserve={r}", f"decode.growth_reserve_min={r / 7:.4f}"]
    return VARIANTS[name]


def stream(url: str, ids: list[int], new_tokens: int) -> dict:
    """One greedy /generate stream to its end: tokens received, completed, preemptions, paused seconds."""
    body = {"input_ids": ids, "stream": True,
            "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}}
    last, error = None, None
    with httpx.stream("POST", url + "/generate", json=body, timeout=STREAM_TIMEOUT_S) as resp:
        if resp.status_code != 200:
            return {"ok": False, "tokens": 0, "output_ids": [], "error": resp.read().decode()[:200],
                    "preemptions": 0, "paused_s": 0.0}
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            ev = json.loads(line[6:])
            if "error" in ev:
                error = ev["error"]["message"]
                break
            last = ev
    ids_out = last["output_ids"] if last else []
    meta = last["meta_info"] if last else {}
    return {"ok": error is None and len(ids_out) == new_tokens, "tokens": len(ids_out), "output_ids": ids_out,
            "error": error, "preemptions": meta.get("preemptions", 0), "paused_s": meta.get("preempted_s", 0.0)}


def batch(url: str, prompts: list[list[int]], new_tokens: int) -> dict:
    """Every prompt streamed at once; the batch's wall time and each stream's outcome."""
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        streams = list(pool.map(lambda ids: stream(url, ids, new_tokens), prompts))
    wall = time.monotonic() - t0
    return {"wall_s": wall, "streams": streams, "tok_s": sum(s["tokens"] for s in streams) / wall,
            "goodput_tok_s": sum(s["tokens"] for s in streams if s["ok"]) / wall,
            "completed": sum(s["ok"] for s in streams) / len(streams)}


def prompts_for(run: int, x: float, n: int, length: int) -> list[list[int]]:
    rng = random.Random(f"{run}-{x}")
    return [[rng.randrange(1000, 20000) for _ in range(length)] for _ in range(n)]


def summarize(batches: list[dict]) -> dict:
    streams = [s for b in batches for s in b["streams"]]
    paused = [s["paused_s"] for s in streams if s["preemptions"]]
    return {"tok_s_median": round(statistics.median(b["tok_s"] for b in batches), 2),
            "goodput_tok_s_median": round(statistics.median(b["goodput_tok_s"] for b in batches), 2),
            "completed": round(sum(s["ok"] for s in streams) / len(streams), 4),
            "preemptions_per_stream": round(sum(s["preemptions"] for s in streams) / len(streams), 3),
            "preempted_streams": len(paused),
            "paused_p50_s": None if not paused else round(percentile(paused, 50), 3),
            "paused_p99_s": None if not paused else round(percentile(paused, 99), 3),
            "wall_s_median": round(statistics.median(b["wall_s"] for b in batches), 2),
            "errors": sorted({(s["error"] or "")[:120] for s in streams if s["error"]})}


def equal_outputs(a: dict, b: dict) -> tuple[int, int]:
    """(streams completed in both with equal outputs, streams completed in both)."""
    both = [(x, y) for x, y in zip(a["streams"], b["streams"]) if x["ok"] and y["ok"]]
    return sum(x["output_ids"] == y["output_ids"] for x, y in both), len(both)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    say = (lambda m: print(m, file=sys.stderr, flush=True)) if args.json else (lambda m: print(m, flush=True))
    names = [v for v in args.variants.split(",") if v]
    xs = [float(x) for x in args.oversubscription.split(",") if x]
    config = args.config or str(default_config_path())
    model_sets = [f"model.source={test_model_dir(args.test_model)}", "model.name="] if args.test_model else []
    sets = model_sets + args.config_overrides + [f"decode.num_pages={args.pages}"]
    clusters: dict[str, ServeCluster] = {}
    try:
        for name in names:
            log_dir = f"{args.log_dir}/{name}" if args.log_dir else None
            clusters[name] = ServeCluster(config, sets + variant_sets(name) + port_overrides(1, 1),
                                          log_dir=log_dir).start()
            say(f"[{name}] ready at {clusters[name].url} (logs in {clusters[name].log_dir})")
        page_size = clusters[names[0]].cfg.model.page_size
        per_stream = pages_for(args.prompt_tokens + args.new_tokens, page_size)
        runs: dict[str, dict[float, list[dict]]] = {n: {x: [] for x in xs} for n in names}
        ratios: dict[str, dict[float, list[float]]] = {n: {x: [] for x in xs} for n in names}
        equal: dict[float, list[tuple[int, int]]] = {x: [] for x in xs}
        for run in range(args.runs):
            for x in xs:
                n = max(1, round(x * args.pages / per_stream))
                prompts = prompts_for(run, x, n, args.prompt_tokens)
                order = names[run % len(names):] + names[:run % len(names)]  # who goes first rotates
                got = {}
                for name in order:
                    got[name] = batch(clusters[name].url, prompts, args.new_tokens)
                    runs[name][x].append(got[name])
                    say(f"run {run + 1}/{args.runs} x{x} ({n} streams) {name}: {got[name]['tok_s']:.1f} tok/s, "
                        f"{got[name]['completed']:.0%} completed, "
                        f"{sum(s['preemptions'] for s in got[name]['streams'])} preemptions")
                if "off" in got:
                    for name in names:
                        ratios[name][x].append(got[name]["tok_s"] / got["off"]["tok_s"])
                if "on" in got and "no_reserve" in got:
                    equal[x].append(equal_outputs(got["on"], got["no_reserve"]))
    finally:
        for c in clusters.values():
            c.stop()
    out = {"bench": "decode_preemption", "pages": args.pages, "prompt_tokens": args.prompt_tokens,
           "new_tokens": args.new_tokens, "pages_per_stream": per_stream, "runs": args.runs, "commit": commit(),
           "sets": sets, "results": {}}
    print(f"\ndecode preemption: pool {args.pages} pages x {page_size} tokens, streams of {args.prompt_tokens} + "
          f"{args.new_tokens} tokens ({per_stream} pages each), {args.runs} runs ({commit()})")
    print(f"{'x':>4} {'variant':<11} {'tok/s p50':>9} {'vs off':>7} {'goodput':>8} {'completed':>9} "
          f"{'preempt/str':>11} {'paused p50':>10} {'paused p99':>10}")
    for x in xs:
        for name in names:
            s = summarize(runs[name][x])
            s["tok_s_over_off_median"] = round(statistics.median(ratios[name][x]), 3) if ratios[name][x] else None
            out["results"].setdefault(str(x), {})[name] = s
            print(f"{x:>4} {name:<11} {s['tok_s_median']:>9.1f} {s['tok_s_over_off_median'] or float('nan'):>7.2f} "
                  f"{s['goodput_tok_s_median']:>8.1f} {s['completed']:>9.0%} {s['preemptions_per_stream']:>11.2f} "
                  f"{s['paused_p50_s'] if s['paused_p50_s'] is not None else '-':>10} "
                  f"{s['paused_p99_s'] if s['paused_p99_s'] is not None else '-':>10}")
        if equal[x]:
            same, both = sum(e[0] for e in equal[x]), sum(e[1] for e in equal[x])
            out["results"][str(x)]["on_vs_no_reserve_equal_outputs"] = [same, both]
            print(f"     outputs equal (on vs no_reserve, greedy): {same}/{both}")
    for x in xs:
        for name in names:
            errors = out["results"][str(x)][name]["errors"]
            if errors:
                print(f"x{x} {name} errors: {errors[0]}")
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
