"""n > 1 (decode_node/forks.py): the KV bytes P pushes to D and the wall time of one request of n
sequences against n requests of one, in one run.

    python -m bench.sampling parallel [--runs 3] [--n 4] [--prompt-tokens 512] [--new-tokens 64]
                                      [--test-model llama3] [--json]

Starts one `pdorch serve` (1 prefill, 1 decode; decode prefix cache off, so every request's prompt
KV is pushed). Per run, on random prompt ids, each variant from cold caches (/flush_cache?store=true):

    one     one completion, n = 1
    n       one completion with n = --n (seed s: sequence i draws with seed s + i)
    apart   --n completions of n = 1 at once (seeds s .. s + n - 1): what a client does without n

Reported per variant (median over runs): P -> D bytes (the prefill worker's
pdorch_prefill_transfer_bytes_total across the variant), prompt tokens P computed, wall seconds;
and the ratios bytes(n) / bytes(one) (the target: 1.0) and wall(n) / wall(apart). Checks that
sequence i of `n` equals request i of `apart` (the same seeds: they must).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import random
import statistics
import sys
import time

import httpx

from bench.multiturn.cluster import ServeCluster, metrics_urls, port_overrides
from bench.multiturn.facts import commit, test_model_dir
from pdorch.config_loader import add_config_args, default_config_path
from pdorch.local_stack.hf_checkpoints import FAMILIES

TIMEOUT_S = 600.0
# the prefill worker's counters, by the start of their sample line
COUNTERS = {"bytes": "pdorch_prefill_transfer_bytes_total ",
            "computed": 'pdorch_prefill_prompt_tokens_total{source="computed"}'}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.sampling parallel", description=__doc__.split("\n")[0],
                                allow_abbrev=False)
    p.add_argument("--runs", type=int, default=3, help="repetitions (default 3)")
    p.add_argument("--n", type=int, default=4, help="sequences per request (default 4)")
    p.add_argument("--prompt-tokens", type=int, default=512, help="tokens per prompt (default 512)")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens per sequence (default 64)")
    p.add_argument("--test-model", choices=FAMILIES, help="serve the random-weights checkpoint of this family "
                   "(pdorch/local_stack/hf_checkpoints.py) instead of model.source")
    p.add_argument("--log-dir", help="component logs (default: a temp dir)")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    add_config_args(p)
    return p


def counters(url: str) -> dict[str, float]:
    text = httpx.get(url, timeout=30).text
    out = dict.fromkeys(COUNTERS, 0.0)
    for line in text.splitlines():
        for key, start in COUNTERS.items():
            if line.startswith(start):
                out[key] += float(line.rsplit(" ", 1)[1])
    return out


def complete(url: str, ids: list[int], new_tokens: int, seed: int, n: int) -> list[list[int]]:
    body = {"prompt": ids, "max_tokens": new_tokens, "temperature": 1.0, "seed": seed, "n": n, "ignore_eos": True,
            "logprobs": 0}
    r = httpx.post(url + "/v1/completions", json=body, timeout=TIMEOUT_S)
    r.raise_for_status()
    choices = sorted(r.json()["choices"], key=lambda c: c["index"])
    return [c["logprobs"]["tokens"] for c in choices]


def measure(url: str, metrics: str, fn) -> dict:
    """fn() from cold caches (every worker's L1 and the store flushed): its wall time and counters."""
    httpx.post(url + "/flush_cache?store=true", timeout=60).raise_for_status()
    before, t0 = counters(metrics), time.monotonic()
    out = fn()
    wall, after = time.monotonic() - t0, counters(metrics)
    return {"wall_s": wall, "output": out, **{k: after[k] - before[k] for k in COUNTERS}}


def one_run(url: str, metrics: str, run: int, n: int, prompt_tokens: int, new_tokens: int) -> dict:
    rng = random.Random(run)
    one_ids, ids = ([rng.randrange(1000, 20000) for _ in range(prompt_tokens)] for _ in range(2))
    seed = 1000 * run
    out = {"one": measure(url, metrics, lambda: complete(url, one_ids, new_tokens, seed, 1)),
           "n": measure(url, metrics, lambda: complete(url, ids, new_tokens, seed, n))}
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        out["apart"] = measure(url, metrics, lambda: [o[0] for o in pool.map(
            lambda i: complete(url, ids, new_tokens, seed + i, 1), range(n))])
    return out


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    say = (lambda m: print(m, file=sys.stderr, flush=True)) if args.json else (lambda m: print(m, flush=True))
    config = args.config or str(default_config_path())
    model_sets = [f"model.source={test_model_dir(args.test_model)}", "model.name="] if args.test_model else []
    sets = model_sets + args.config_overrides + ["decode.prefix_cache=false", f"router.max_n={max(args.n, 1)}"]
    cluster = ServeCluster(config, sets + port_overrides(1, 1), log_dir=args.log_dir).start()
    results: dict[str, list[dict]] = {"one": [], "n": [], "apart": []}
    equal = []
    try:
        say(f"ready at {cluster.url} (logs in {cluster.log_dir})")
        metrics = metrics_urls(cluster.cfg, 1, 1)[0][0]  # the prefill worker's
        url, n = cluster.url, args.n
        for run in range(args.runs):
            got = one_run(url, metrics, run, n, args.prompt_tokens, args.new_tokens)
            for name, runs in results.items():
                runs.append(got[name])
            equal.append(got["n"]["output"] == got["apart"]["output"])
            say(f"run {run + 1}/{args.runs}: bytes one {got['one']['bytes']:.0f}, n={n} {got['n']['bytes']:.0f}, "
                f"apart {got['apart']['bytes']:.0f}; wall n={n} {got['n']['wall_s']:.2f} s, apart "
                f"{got['apart']['wall_s']:.2f} s; sequences equal to apart: {equal[-1]}")
    finally:
        cluster.stop()

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    out = {"bench": "parallel_sampling", "n": n, "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
           "runs": args.runs, "commit": commit(), "sets": sets,
           "results": {name: {k: round(med(name, k), 3) for k in ("bytes", "computed", "wall_s")} for name in results},
           "bytes_n_over_one": [round(a["bytes"] / b["bytes"], 4) for a, b in zip(results["n"], results["one"])],
           "wall_n_over_apart": [round(a["wall_s"] / b["wall_s"], 3) for a, b in zip(results["n"], results["apart"])],
           "sequences_equal_apart": equal}
    print(f"\nn={n}: {args.prompt_tokens}-token prompts, {args.new_tokens} tokens per sequence, {args.runs} runs "
          f"({commit()})")
    print(f"{'variant':<8} {'P->D bytes':>12} {'P computed':>11} {'wall s':>7}")
    for name, r in out["results"].items():
        print(f"{name:<8} {r['bytes']:>12.0f} {r['computed']:>11.0f} {r['wall_s']:>7.2f}")
    print(f"bytes n / one per run: {out['bytes_n_over_one']}; wall n / apart per run: {out['wall_n_over_apart']}; "
          f"sequences equal to apart: {equal}")
    if args.json:
        print(json.dumps(out))
    return 0

