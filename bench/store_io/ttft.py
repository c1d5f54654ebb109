"""Time to first token of the disaggregated path, by where the prompt's prefix KV comes from.

Starts a real cluster on loopback (mooncake_master, one prefill and three decode worker processes,
transfer engine over TCP) and, for a prompt of --prompt-tokens tokens, measures TTFT (Generate
sent -> first streamed token) with the prefix
  (a) recomputed     first sight of the prompt: every token is prefilled on P
  (b) from store     same prompt after flushing every L1 (P's and the decode workers'): P reads the full pages from the Mooncake
                     store and pushes every page to D
  (c) from L1        same prompt again: the pages are in P's own pool
  (d) store -> D     every L1 flushed, a decode worker with decode.load_prefix_from_store: D reads the
                     prefix pages itself while P computes the last page; P pushes only that page
  (e) D alone        the same with decode.max_local_prefill_tokens: D reads the prefix and computes
                     the last page itself; no prefill call at all (conditional disaggregation)
plus the P->D push of a whole prompt (bytes, seconds, GB/s, from P's metrics in (a)-(c)) against
the raw transfer engine between two other processes in the same run (one contiguous write of as
many bytes, median of 5): transfer_over_raw_ratio.
Each of --runs rounds uses a fresh prompt of the same length; the table shows medians.
Headlines: store_over_recompute_ratio = (b) / (a), store_decode_over_recompute_ratio = (d) / (a).
Control: last_page_forward_s, the one forward every cached case still runs (the page holding the
last prompt token on top of the cached rest), in this process once the cluster is gone.

    python bench/store_io/ttft.py [--prompt-tokens 2000] [--runs 3] [--torch-threads 2] [--json]

NOTE: the cluster launcher is the integration tests' one (pdorch/local_stack/workers.py), so run
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

ROOT = Path(__file__).resolve().parents[2]
# NOTE: first, unconditionally: ahead of this script's own folder, whose modules must not shadow the project's.
sys.path.insert(0, str(ROOT))

from engine.prepare import DEFAULT_CACHE_DIR, prepare_model
from engine.tokenizer import Tokenizer
from pdorch.local_stack.store import Peer
from pdorch.local_stack.workers import start_cluster
from proto.pdorch.v1 import worker_pb2 as pb

CASES = ("recompute", "store", "l1", "store_decode", "decode_alone")
FULL_PUSH_CASES = ("recompute", "store", "l1")  # every prompt page pushed P->D


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


def ttft(cluster, ids: list[int], decode) -> tuple[float, pb.CachedTokens]:
    req = pb.GenerateRequest(request_id=uuid.uuid4().hex, token_ids=ids,
                             sampling=pb.SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True),
                             prefill_address=cluster.prefill.address, timeout_s=600)
    t0 = time.perf_counter()
    first, cached = None, None
    for chunk in cluster.decode_stub(decode).Generate(req, timeout=620):
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


def raw_transfer_gbps(tmp: str, nbytes: int, reps: int = 5) -> float:
    """The transfer engine alone: one contiguous write of `nbytes` from this process into another
    (a plain receiver process: the same TCP path a P->D push takes, without the workers)."""
    import numpy as np

    from store_client.transfer import KVTransfer

    target = Peer("transfer-target", {"nbytes": nbytes}, tmp)
    src = np.ones(nbytes, dtype=np.uint8)
    sender = KVTransfer("127.0.0.1", "tcp", "")
    try:
        sender.start()
        sender.register(src.ctypes.data, src.nbytes)
        seg, base = target.ready["segment"], target.ready["ptr"]
        sender.write(seg, [src.ctypes.data], [base], nbytes)  # the first write pays the handshake
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            sender.write(seg, [src.ctypes.data], [base], nbytes)
            times.append(time.perf_counter() - t0)
        return nbytes / statistics.median(times) / 1e9
    finally:
        sender.close()
        target.stop()


def last_page_forward_s(model_dir, ids: list[int], page: int, threads: int, reps: int = 5) -> float:
    """The control for (d) and (e): one forward over the prompt's last (partial) page on top of the
    cached rest, which every cached run must still compute (its logits give the first token), in
    this process with the workers' torch threads; median of `reps`."""
    import torch

    from engine.kv_pool import KVPool
    from engine.loader import load_model
    from engine.model_runner import Chunk, ModelRunner

    torch.set_num_threads(threads)
    arch, model = load_model(model_dir)
    pages = list(range(-(-len(ids) // page)))
    runner = ModelRunner(model, arch, KVPool(arch, len(pages), page, torch.float32, "cpu"))
    start = (len(ids) - 1) // page * page
    times = []
    with torch.inference_mode():
        runner.forward([Chunk(pages, 0, ids)])  # the cached prefix, in place
        for _ in range(reps):
            t0 = time.perf_counter()
            runner.forward([Chunk(pages, start, ids[start:])])
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run(args) -> dict:
    model_dir = prepare_model(args.model, DEFAULT_CACHE_DIR, progress=lambda m: None)
    tok = Tokenizer.from_dir(model_dir)
    page = args.page_size
    pages_needed = args.prompt_tokens // page + 8
    plain = {"offload_generated_kv": False, "load_prefix_from_store": False, "max_local_prefill_tokens": 0}
    with tempfile.TemporaryDirectory(prefix="pdorch_ttft_") as tmp:
        cluster = start_cluster(Path(tmp), model_dir, with_store=True,
                                model={"torch_threads": args.torch_threads, "page_size": page},
                                # NOTE: P's segment must hold every run's prompt pages or later runs'
                                # write-backs fail (the decode workers mount one too).
                                store={"global_segment_size_mb": max(512, 2 * args.runs * pages_needed)},
                                prefill={"num_pages": 2 * pages_needed, "chunk_tokens": 512},
                                decode={"num_pages": 2 * pages_needed, "prefill_timeout_s": 600.0, **plain})
        try:
            decoders = {case: cluster.decode for case in FULL_PUSH_CASES}
            decoders["store_decode"] = cluster.spawn_worker("decode", **{**plain, "load_prefix_from_store": True})
            decoders["decode_alone"] = cluster.spawn_worker("decode", **{**plain, "load_prefix_from_store": True,
                                                                          "max_local_prefill_tokens": 256})
            cluster.wait_ready(decoders["store_decode"], decoders["decode_alone"])
            rows = {case: [] for case in CASES}
            pushes = {case: [0.0, 0.0, 0] for case in CASES}  # seconds, pushes, bytes
            cached_seen = {}
            for wp in {id(w): w for w in decoders.values()}.values():  # each D's first transfer: handshake
                ttft(cluster, prompt_ids(tok, 64, salt=10_000 + wp.port), wp)
            for r in range(args.runs):
                ids = prompt_ids(tok, args.prompt_tokens, salt=r)
                for case in CASES:
                    if case in ("store", "store_decode", "decode_alone"):
                        # NOTE: every worker's L1, the decode workers' own prefix caches too (they keep
                        # the KV of what they served): otherwise (b) would measure D's cache, not the store.
                        cluster.flush_l1()
                    before = transfer_totals(cluster)
                    seconds, cached = ttft(cluster, ids, decoders[case])
                    after = transfer_totals(cluster)
                    for i in range(3):
                        pushes[case][i] += after[i] - before[i]
                    rows[case].append(seconds)
                    cached_seen[case] = {"device": cached.device, "store": cached.store}
                    if not args.json:
                        print(f"run {r} {case:12s} ttft {seconds:7.3f}s cached device={cached.device} "
                              f"store={cached.store}", flush=True)
            raw_gbps = raw_transfer_gbps(tmp, int(pushes["recompute"][2] // max(pushes["recompute"][1], 1)))
        finally:
            cluster.stop()
    forward_s = last_page_forward_s(model_dir, ids, page, args.torch_threads)
    full = [sum(pushes[c][i] for c in FULL_PUSH_CASES) for i in range(3)]
    transfer_s, transfer_bytes = full[0] / max(full[1], 1), full[2] / max(full[1], 1)
    transfer_gbps = transfer_bytes / transfer_s / 1e9 if transfer_s > 0 else 0.0
    sd = pushes["store_decode"]
    med = {k: statistics.median(v) for k, v in rows.items()}
    return {
        "model": args.model, "prompt_tokens": args.prompt_tokens, "page_size": page, "runs": args.runs,
        "torch_threads": args.torch_threads,
        "ttft_recompute_s": round(med["recompute"], 4), "ttft_store_s": round(med["store"], 4),
        "ttft_l1_s": round(med["l1"], 4), "ttft_store_decode_s": round(med["store_decode"], 4),
        "ttft_decode_alone_s": round(med["decode_alone"], 4),
        "store_over_recompute_ratio": round(med["store"] / med["recompute"], 4),
        "l1_over_recompute_ratio": round(med["l1"] / med["recompute"], 4),
        "store_decode_over_recompute_ratio": round(med["store_decode"] / med["recompute"], 4),
        "decode_alone_over_recompute_ratio": round(med["decode_alone"] / med["recompute"], 4),
        "cached_tokens_store_run": cached_seen["store"]["store"], "cached_tokens_l1_run": cached_seen["l1"]["device"],
        "cached_tokens_decode_alone_run": cached_seen["decode_alone"]["store"],
        "transfer_bytes_per_request": int(transfer_bytes), "transfer_s": round(transfer_s, 4),
        "transfer_gbps": round(transfer_gbps, 3), "raw_transfer_gbps": round(raw_gbps, 3),
        "transfer_over_raw_ratio": round(transfer_gbps / raw_gbps, 3) if raw_gbps > 0 else 0.0,
        "transfer_bytes_store_decode": int(sd[2] / max(sd[1], 1)),
        "prefill_calls_decode_alone": int(pushes["decode_alone"][1]),
        "last_page_forward_s": round(forward_s, 4),
        "last_page_forward_over_recompute_ratio": round(forward_s / med["recompute"], 4),
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
    print(f"  (d) store -> D      {res['ttft_store_decode_s']:8.3f} s   ratio d/a "
          f"{res['store_decode_over_recompute_ratio']:.3f} (P->D push {res['transfer_bytes_store_decode'] / 1e6:.2f} MB)")
    print(f"  (e) D alone         {res['ttft_decode_alone_s']:8.3f} s   ratio e/a "
          f"{res['decode_alone_over_recompute_ratio']:.3f} (prefill calls: {res['prefill_calls_decode_alone']})")
    print(f"  control: the last page's forward alone {res['last_page_forward_s']:.3f} s = "
          f"{res['last_page_forward_over_recompute_ratio']:.3f} of (a): the floor of (b)-(e)")
    print(f"  P->D push           {res['transfer_bytes_per_request'] / 1e6:8.1f} MB in {res['transfer_s']:.4f} s "
          f"= {res['transfer_gbps']:.2f} GB/s; raw transfer engine {res['raw_transfer_gbps']:.2f} GB/s, "
          f"ratio {res['transfer_over_raw_ratio']:.3f}")
    if args.json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
