"""Step time of a tensor-parallel model at TP 2 against TP 1 on CPU (gloo): what a TP worker's forward
costs here, recorded, not asserted (TP is for models bigger than one GPU; on two CPU cores it can
only show the collectives' overhead).

    python bench/engine/tp_step.py [--runs 5] [--json]

A random Llama-3-shaped checkpoint (built by transformers; 8 layers, hidden 1024, 16 query and 8 KV
heads, ffn 2816, vocabulary 32,000). Each case runs in fresh processes: TP 1 = one process with 2
torch threads, TP 2 = two ranks with 1 thread each (the same two cores). Timed: one prefill chunk of
512 tokens, and decode steps of a batch of 16 at 512 tokens of context. Medians of `--runs` runs,
each run the median of its steps, TP 1 and TP 2 interleaved.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import pathlib
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SHAPE = {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8, "num_attention_heads": 16,
         "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 4096, "vocab_size": 32000}
PAGE, PREFILL, BATCH, CONTEXT, STEPS = 16, 512, 16, 512, 8


def rank_main(rank: int, size: int, model_dir: str, init: str, out) -> None:
    import torch

    from engine.kv_pool import KVPool
    from engine.loader import load_model
    from engine.model_runner import Chunk, ModelRunner
    from engine.tensor_parallel import TPGroup, TPShard, init_tp_group

    torch.set_num_threads(2 // size)
    group = init_tp_group(rank, size, init, "gloo", 120) if size > 1 else TPGroup()
    _, model = load_model(model_dir, shard=TPShard(rank, size), group=group)
    pages_per_seq = CONTEXT // PAGE + 1
    pool = KVPool(model.local_arch, BATCH * pages_per_seq + PREFILL // PAGE, PAGE)
    runner = ModelRunner(model, model.local_arch, pool)
    gen = torch.Generator().manual_seed(0)
    tables = [list(range(i * pages_per_seq, (i + 1) * pages_per_seq)) for i in range(BATCH)]
    with torch.inference_mode():
        for t in tables:  # each sequence's context, untimed
            runner.forward([Chunk(t, 0, torch.randint(0, 32000, (CONTEXT,), generator=gen).tolist())])
        prefill_pages = list(range(BATCH * pages_per_seq, BATCH * pages_per_seq + PREFILL // PAGE))
        prompt = torch.randint(0, 32000, (PREFILL,), generator=gen).tolist()
        prefill = []
        for _ in range(3):
            t0 = time.perf_counter()
            runner.forward([Chunk(prefill_pages, 0, prompt)])
            prefill.append(time.perf_counter() - t0)
        decode = []
        for step in range(STEPS):
            t0 = time.perf_counter()
            runner.forward([Chunk(t, CONTEXT + step, [7]) for t in tables])
            decode.append(time.perf_counter() - t0)
    if size > 1:
        group.close()
    if rank == 0:
        out.put({"prefill_s": statistics.median(prefill), "decode_step_s": statistics.median(decode[1:])})


def run_case(size: int, model_dir: str) -> dict:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=rank_main, args=(r, size, model_dir, f"file://{tmp}/rdv", out))
                 for r in range(size)]
        for p in procs:
            p.start()
        result = out.get(timeout=600)
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from pdorch.local_stack.hf_checkpoints import build_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(build_checkpoint("llama3", pathlib.Path(tmp) / "m", seed=0, tokenizer=False, shape=SHAPE))
        runs = {1: [], 2: []}
        for _ in range(args.runs):
            for size in (1, 2):
                runs[size].append(run_case(size, model_dir))
    med = {size: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for size, rs in runs.items()}
    result = {"prefill_512_s": {str(s): round(m["prefill_s"], 4) for s, m in med.items()},
              "decode_b16_step_s": {str(s): round(m["decode_step_s"], 4) for s, m in med.items()},
              "prefill_tp2_over_tp1": round(med[2]["prefill_s"] / med[1]["prefill_s"], 3),
              "decode_tp2_over_tp1": round(med[2]["decode_step_s"] / med[1]["decode_step_s"], 3),
              "runs": args.runs}
    print(f"prefill {PREFILL} tokens: TP1 {med[1]['prefill_s'] * 1e3:.1f} ms, TP2 {med[2]['prefill_s'] * 1e3:.1f} ms "
          f"(x{result['prefill_tp2_over_tp1']})")
    print(f"decode step, batch {BATCH} at {CONTEXT}: TP1 {med[1]['decode_step_s'] * 1e3:.1f} ms, "
          f"TP2 {med[2]['decode_step_s'] * 1e3:.1f} ms (x{result['decode_tp2_over_tp1']})")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
