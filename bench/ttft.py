"""Time to first token of the disaggregated path, by where the prompt's prefix KV comes from.

Starts a real cluster on loopback (mooncake_master, one prefill and one decode worker process,
transfer engine over TCP) and, for a prompt of --prompt-tokens tokens, measures TTFT (Generate
sent -> first streamed token) with the prefix
  (a) recomputed   first sight of the prompt: every token is prefilled on P
  (b) from store   same prompt after flushing P's L1: full pages are read from the Mooncake store
  (c) from L1      same prompt again: the pages are in P's own pool
plus the P->D KV push (bytes, seconds, GB/s) from the prefill worker's transfer metrics.
Each of --runs rounds uses a fresh prompt of the same length; the table shows medians.
Headline: store_over_recompute_ratio = (b) / (a) (target <= 0.10).

    python bench/ttft.py [--prompt-tokens 2000] [--runs 3] [--torch-threads 2] [--json]

NOTE: the cluster launcher is the integration tests' one (tests/fixtures/workers.py), so run
this from a repository checkout with the dev requirements installed (`make setup`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engine.prepare import DEFAULT_CACHE_DIR, prepare_model
from engine.tokenizer import Tokenizer
from proto.pdorch.v1 import worker_pb2 as pb
from tests.fixtures.workers import start_cluster


def prompt_ids(tok: Tokenizer, n: int, salt: int) -> list[int]:
    """Exactly n token ids of varied English text; `salt` makes each run's prompt distinct."""
    words = ["river", "harbour", "merchant", "lantern", "copper", "meadow", "signal", "orchard", "engine"]
    text, ids = "", []
    i = 0
    while len(ids) < n:
        text += (f" Run {salt} line {i}: the {words[(i * 7 + salt) % 9]} near the {words[(i * 5) % 9]} "
                 f"counts {(i * 37 + salt) % 1000} {words[(i * 3) % 9]}s.")
        i += 1
        if i % 20 == 0:
            ids = tok.encode(text)
    return tok.encode(text)[:n]


def ttft(cluster, ids: list[int]) -> tuple[float, pb.CachedTokens]:
    req = pb.GenerateRequest(request_id=uuid.uuid4().hex, token_ids=ids,
                             sampling=pb.SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True),
                             prefill_address=cluster.prefill.address, timeout_s=600)
    t0 = time.perf_counter()
    first, cached = None, None
    for chunk in cluster.decode_stub().Generate(req, timeout=620):
        if first is None and chunk.token_ids:
            first, cached = time.perf_counter() - t0, chunk.cached
    return first, cached


def transfer_totals(cluster) -> tuple[float, float, int]:
    """(seconds sum, count) of pdorch_prefill_transfer_seconds and transfer bytes, from P's metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{cluster.prefill.metrics_port}/metrics", timeout=10).read()
    values = {}
    for line in text.decode().splitlines():
        if line.startswith(("pdorch_prefill_transfer_seconds_sum", "pdorch_prefill_transfer_seconds_count",
                            "pdorch_prefill_transfer_bytes_total")):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return (values["pdorch_prefill_transfer_seconds_sum"], values["pdorch_prefill_transfer_seconds_count"],
            int(values["pdorch_prefill_transfer_bytes_total"]))


def run(args) -> dict:
    model_dir = prepare_model(args.model, DEFAULT_CACHE_DIR, progress=lambda m: None)
    tok = Tokenizer.from_dir(model_dir)
    page = args.page_size
    pages_needed = args.prompt_tokens // page + 8
    with tempfile.TemporaryDirectory(prefix="pdorch_ttft_") as tmp:
        cluster = start_cluster(Path(tmp), model_dir, with_store=True,
                                model={"torch_threads": args.torch_threads, "page_size": page},
                                # NOTE: only P mounts a store segment here (D does not offload), so it
                                # must hold every run's prompt pages or later runs' write-backs fail.
                                store={"global_segment_size_mb": max(512, 2 * args.runs * pages_needed)},
                                prefill={"num_pages": 2 * pages_needed, "chunk_tokens": 512},
                                decode={"num_pages": 2 * pages_needed, "prefill_timeout_s": 600.0,
                                        "offload_generated_kv": False})
        try:
            rows = {"recompute": [], "store": [], "l1": []}
            cached_seen = {}
            t_sum0, t_cnt0, bytes0 = transfer_totals(cluster)
            warm = prompt_ids(tok, 64, salt=10_000)
            ttft(cluster, warm)  # first transfer pays the engine handshake; keep it out of the numbers
            t_sum0, t_cnt0, bytes0 = transfer_totals(cluster)
            for r in range(args.runs):
                ids = prompt_ids(tok, args.prompt_tokens, salt=r)
                for tier in ("recompute", "store", "l1"):
                    if tier == "store":
                        cluster.wait_idle("prefill", timeout_s=120)  # write-back of (a) done
                        cluster.prefill_stub().Flush(pb.FlushRequest(), timeout=60)
                    seconds, cached = ttft(cluster, ids)
                    rows[tier].append(seconds)
                    cached_seen[tier] = {"device": cached.device, "store": cached.store}
                    if not args.json:
                        print(f"run {r} {tier:9s} ttft {seconds:7.3f}s cached device={cached.device} "
                              f"store={cached.store}", flush=True)
            t_sum, t_cnt, nbytes = transfer_totals(cluster)
        finally:
            cluster.stop()
    transfer_s = (t_sum - t_sum0) / max(t_cnt - t_cnt0, 1)
    transfer_bytes = (nbytes - bytes0) / max(t_cnt - t_cnt0, 1)
    med = {k: statistics.median(v) for k, v in rows.items()}
    return {
        "model": args.model, "prompt_tokens": args.prompt_tokens, "page_size": page, "runs": args.runs,
        "torch_threads": args.torch_threads,
        "ttft_recompute_s": round(med["recompute"], 4), "ttft_store_s": round(med["store"], 4),
        "ttft_l1_s": round(med["l1"], 4),
        "store_over_recompute_ratio": round(med["store"] / med["recompute"], 4),
        "l1_over_recompute_ratio": round(med["l1"] / med["recompute"], 4),
        "cached_tokens_store_run": cached_seen["store"]["store"], "cached_tokens_l1_run": cached_seen["l1"]["device"],
        "transfer_bytes_per_request": int(transfer_bytes), "transfer_s": round(transfer_s, 4),
        "transfer_gbps": round(transfer_bytes / transfer_s / 1e9, 3) if transfer_s > 0 else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2", help="model source (smollm2 or an HF directory)")
    p.add_argument("--prompt-tokens", type=int, default=2000)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--runs", type=int, default=3, help="rounds with fresh prompts (medians reported)")
    p.add_argument("--torch-threads", type=int, default=2, help="torch threads per worker")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = p.parse_args(argv)
    res = run(args)
    print(f"\nTTFT, {res['model']}, {res['prompt_tokens']}-token prompt, page {res['page_size']}, "
          f"median of {res['runs']} runs")
    print(f"  (a) recomputed      {res['ttft_recompute_s']:8.3f} s")
    print(f"  (b) from the store  {res['ttft_store_s']:8.3f} s   ratio b/a {res['store_over_recompute_ratio']:.3f} "
          f"(cached from store: {res['cached_tokens_store_run']} tokens)")
    print(f"  (c) from L1         {res['ttft_l1_s']:8.3f} s   ratio c/a {res['l1_over_recompute_ratio']:.3f} "
          f"(cached in L1: {res['cached_tokens_l1_run']} tokens)")
    print(f"  P->D push           {res['transfer_bytes_per_request'] / 1e6:8.1f} MB in {res['transfer_s']:.4f} s "
          f"= {res['transfer_gbps']:.2f} GB/s")
    if args.json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
