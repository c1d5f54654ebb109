"""The P -> D KV transfer between workers of different TP sizes, against both at TP 1: bytes and time
per request, real workers (ranks as processes, the real transfer engine over TCP loopback).

    python bench/engine/tp_transfer.py [--requests 8] [--json]

For each (P, D) TP pair in (1, 1), (2, 1), (1, 2): a cluster of one prefill and one decode worker
(no store, no local prefill on D: every prompt page is pushed), a random Llama-3-shaped checkpoint
(8 layers, 8 KV heads of 64, fp32: 512 KiB of KV per 16-token page), `--requests` prompts of 1,024
tokens sent one after another. From P's metrics: bytes pushed per request (every rank's share) and
the push time per request (pdorch_prefill_transfer_seconds: from the push's start until every rank's
share has landed). At (2, 1) each P rank writes its 4 heads (half of each page) to D's one pool; at
(1, 2) P writes each page's two halves to D's two ranks.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SHAPE = {"hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 8,
         "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 4096}
PAIRS = [(1, 1), (2, 1), (1, 2)]
PROMPT = 1024


def run_pair(model_dir, tmp: pathlib.Path, p: int, d: int, requests: int) -> dict:
    from pdorch.local_stack.workers import start_cluster, worker_metric

    c = start_cluster(tmp, model_dir, with_store=False, prefill={"tp_size": p, "num_pages": 256},
                      decode={"tp_size": d, "num_pages": 256, "max_local_prefill_tokens": 0,
                              "prefix_cache": False})
    try:
        rng = random.Random(p * 10 + d)
        c.generate([rng.randrange(5, 4000) for _ in range(64)], max_tokens=1)  # warm-up: connections
        b0 = worker_metric(c.prefill, "pdorch_prefill_transfer_bytes_total")
        s0 = worker_metric(c.prefill, "pdorch_prefill_transfer_seconds_sum")
        for _ in range(requests):
            c.generate([rng.randrange(5, 4000) for _ in range(PROMPT)], max_tokens=1)
            c.wait_idle("prefill")
        nbytes = worker_metric(c.prefill, "pdorch_prefill_transfer_bytes_total") - b0
        seconds = worker_metric(c.prefill, "pdorch_prefill_transfer_seconds_sum") - s0
    finally:
        c.stop()
    return {"bytes_per_request": nbytes / requests, "push_s_per_request": seconds / requests}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from pdorch.local_stack.hf_checkpoints import build_checkpoint

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        model_dir = build_checkpoint("llama3", root / "m", seed=0, shape=SHAPE)
        for p, d in PAIRS:
            (root / f"c{p}{d}").mkdir()
            out[f"{p},{d}"] = run_pair(model_dir, root / f"c{p}{d}", p, d, args.requests)
    base = out["1,1"]
    for key, r in out.items():
        r["bytes_vs_1_1"] = round(r["bytes_per_request"] / base["bytes_per_request"], 3)
        r["time_vs_1_1"] = round(r["push_s_per_request"] / base["push_s_per_request"], 3)
        print(f"(P, D) = ({key}): {r['bytes_per_request'] / 2**20:.1f} MiB / request (x{r['bytes_vs_1_1']}), "
              f"push {r['push_s_per_request'] * 1e3:.1f} ms / request (x{r['time_vs_1_1']})")
    if args.json:
        print(json.dumps({"pairs": out, "requests": args.requests, "prompt_tokens": PROMPT}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
