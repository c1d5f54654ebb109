"""Long shared documents read back from the store: many clients ask short questions about a few long
documents (default 4 x 1,500 tokens).

    pass 1   one request per document: the prefill worker computes it and writes its pages back
    pass 2   waves of one request per document; before each wave every worker's L1 is flushed, so
             every request of pass 2 loads its document from the store
    baseline the same pass-2 waves on a cluster with the store off: every document is recomputed

Reports TTFT of pass 2 against the baseline (`store_over_off_ttft_ratio`, lower is better), the
tokens each tier provided and the page-aligned ideal.

    python -m bench.store_io.long_context [--docs 4] [--doc-tokens 1500] [--clients 8] [--json]
    pdorch bench long-context ...
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# NOTE: first, unconditionally: ahead of this script's own folder, whose modules must not shadow the project's.
sys.path.insert(0, str(ROOT))

from bench.multiturn.client import HttpBackend
from bench.multiturn.cluster import ServeCluster, effective_config, metrics_urls, port_overrides
from bench.multiturn.conversation import Prompt
from bench.multiturn.facts import model_facts
from bench.multiturn.run import Target, flush_l1, wait_quiet
from bench.multiturn.stats import TIERS, ideal_cached_tokens, mean, percentile, ratio, rounded
from bench.multiturn.text import TurnSource
from pdorch.config_loader import add_config_args, default_config_path


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pdorch bench long-context", description=__doc__.split("\n")[0],
                                allow_abbrev=False)
    p.add_argument("--docs", type=int, default=4)
    p.add_argument("--doc-tokens", type=int, default=1500)
    p.add_argument("--clients", type=int, default=8, help="pass-2 requests (client i asks about doc i %% docs)")
    p.add_argument("--question-tokens", type=int, default=32)
    p.add_argument("--output-tokens", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0, help="deadline of one request (s)")
    p.add_argument("--log-dir", help="component logs (default: temp dirs)")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    add_config_args(p)
    return p


def sizes(args, page: int) -> list[str]:
    """Pools that hold one wave (every document at once) and a store that holds every document."""
    per_request = math.ceil((args.doc_tokens + args.question_tokens + args.output_tokens + 1) / page)
    pages = args.docs * per_request + 32
    return [f"prefill.num_pages={pages}", f"decode.num_pages={pages}", "decode.prefill_timeout_s=600"]


def prompts(args, turns: TurnSource, page: int) -> tuple[list[Prompt], list[list[Prompt]]]:
    """(pass 1: one per document, pass 2: waves of one request per document)."""
    docs = [turns.turn(10_000 + d, 0, args.doc_tokens)[0] for d in range(args.docs)]

    def prompt(client: int, doc: int) -> Prompt:
        ids = docs[doc] + turns.turn(client, 1, args.question_tokens)[0]
        # The document is the shared context: its full pages are what a cache can reuse.
        return Prompt(client, 0, ids, None, ideal_cached_tokens(ids, docs[doc], len(docs[doc]), page), 0)

    warm = [prompt(-1 - d, d) for d in range(args.docs)]
    asks = [prompt(c, c % args.docs) for c in range(args.clients)]
    return warm, [asks[i:i + args.docs] for i in range(0, len(asks), args.docs)]


async def measure(target: Target, backend: HttpBackend, warm, waves, store_on: bool) -> list:
    if store_on:
        await asyncio.gather(*(backend.send(p) for p in warm))
    replies = []
    for wave in waves:
        await asyncio.to_thread(flush_l1, target)  # NOTE: waits for write-backs first
        replies += list(zip(wave, await asyncio.gather(*(backend.send(p) for p in wave))))
    await asyncio.to_thread(wait_quiet, target)
    await backend.close()
    return replies


def summarize(replies) -> dict:
    ok = [(p, r) for p, r in replies if r.error is None]
    ttft = [r.ttft_s for _, r in ok if r.ttft_s is not None]
    prompt = sum(len(p.ids) for p, _ in ok)
    tiers = {t: sum((r.tiers or {}).get(t, 0) for _, r in ok) for t in TIERS}
    return {"requests": len(replies), "failed": len(replies) - len(ok), "ttft_mean_s": mean(ttft),
            "ttft_p50_s": percentile(ttft, 50), "ttft_p90_s": percentile(ttft, 90),
            "hit_rate": ratio(sum(r.cached_tokens for _, r in ok), prompt),
            "ideal_hit_rate": ratio(sum(p.ideal_tokens for p, _ in ok), prompt), "tier_tokens": tiers}


def run_cluster(args, sets: list[str], facts, key: str, warm, waves, store_on: bool) -> dict:
    name = facts[4]
    sets = sets + port_overrides(1, 1)
    cluster = ServeCluster(args.config, sets, log_dir=f"{args.log_dir}/{key}" if args.log_dir else None).start()
    print(f"[{key}] cluster ready at {cluster.url} (logs in {cluster.log_dir})", file=sys.stderr, flush=True)
    try:
        cfg = cluster.cfg
        workers, master = metrics_urls(cfg, 1, 1)
        target = Target(url=cluster.url, model=name, admin_key=cfg.router.admin_key, worker_metrics=workers,
                        master_metrics=master)
        backend = HttpBackend(cluster.url, "sglang", name, args.output_tokens, args.timeout, args.docs,
                              cfg.router.api_key)
        return summarize(asyncio.run(measure(target, backend, warm, waves, store_on)))
    finally:
        cluster.stop()


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.config = args.config or str(default_config_path())
    t0 = time.monotonic()
    facts = model_facts(None, effective_config(args.config, args.config_overrides))
    tok, page = facts[0], facts[3]
    warm, waves = prompts(args, TurnSource(tok, args.seed), page)
    base = sizes(args, page)
    store = run_cluster(args, base + args.config_overrides, facts, "store", warm, waves, True)
    off = run_cluster(args, base + ["store.enabled=false"] + args.config_overrides, facts, "off", warm, waves,
                      False)
    res = {"bench": "long_context", "docs": args.docs, "doc_tokens": args.doc_tokens, "clients": args.clients,
           "store": store, "store_off": off,
           "store_over_off_ttft_ratio": ratio(store["ttft_mean_s"], off["ttft_mean_s"]),
           "elapsed_s": time.monotonic() - t0}
    print(f"\nlong context: {args.clients} requests over {args.docs} documents of {args.doc_tokens} tokens, "
          f"L1 flushed before each wave of {args.docs}")
    print("            ttft mean/p50/p90 s      hit  ideal   device/host/store tokens  failed")
    for label, r in (("store on", store), ("store off", off)):
        t = r["tier_tokens"]
        print(f"{label:10s}  {r['ttft_mean_s'] or 0:6.2f} {r['ttft_p50_s'] or 0:6.2f} {r['ttft_p90_s'] or 0:6.2f}  "
              f"{r['hit_rate'] or 0:7.3f} {r['ideal_hit_rate'] or 0:6.3f}   {t['device']}/{t['host']}/{t['store']}"
              f"  {r['failed']}")
    print(f"TTFT store on / store off: {res['store_over_off_ttft_ratio'] or 0:.3f}")
    if args.json:
        print(json.dumps(rounded(res)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
