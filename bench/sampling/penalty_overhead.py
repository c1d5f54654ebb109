"""Penalties (repetition, frequency, presence) on a decode batch: what they cost a step when each request
keeps its token counts (engine/sampler.py TokenCounts: a step counts its new tokens only) against the
control, the counts rebuilt from every row's whole history each step (what a caller without
TokenCounts gets; every decode step did so before, with a slower count).

  B rows with histories of `context` tokens (the last 100 output), each step appends one token per
  row; the two variants take turns step by step on the same logits, so machine noise hits both alike.
  Median milliseconds per step of the counting alone (history_counts: host work on any device), then
  of apply_controls on the same histories (kept: already counted, so its bookkeeping and the
  penalties' arithmetic; rebuilt: all of it again; on a CPU the arithmetic over [B, vocab] is most
  of it, a GPU's kernels on a GPU); headline: counting kept / rebuilt.

    python -m bench.sampling penalty-overhead [--json] [--batch 32] [--context 4096] [--steps 30]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from engine.sampler import TokenCounts, TokenHistory, apply_controls, history_counts
from engine.sampling_params import SamplingParams


def study(batch: int, context: int, vocab: int, steps: int) -> dict:
    g = torch.Generator().manual_seed(0)
    histories = [torch.randint(vocab, (context,), generator=g).tolist() for _ in range(batch)]
    params = [SamplingParams(temperature=0.7, presence_penalty=0.5, frequency_penalty=0.5, repetition_penalty=1.1)] * batch
    counts = [TokenCounts() for _ in range(batch)]
    start = context - 100
    times: dict[str, list[float]] = {"kept": [], "rebuilt": [], "kept_count": [], "rebuilt_count": []}
    dev = torch.device("cpu")
    for step in range(steps + 3):  # 3 warm-up steps (the first one counts every history for "kept" too)
        logits = torch.randn(batch, vocab, generator=g)
        for kind in ("kept", "rebuilt"):
            hist = [TokenHistory(h, start, counts=c if kind == "kept" else None) for h, c in zip(histories, counts)]
            t0 = time.perf_counter()
            history_counts(hist, vocab, dev)
            t1 = time.perf_counter()
            apply_controls(logits, params, hist)
            t2 = time.perf_counter()
            if step >= 3:
                times[f"{kind}_count"].append(t1 - t0)
                times[kind].append(t2 - t1)
        for h in histories:
            h.append(int(torch.randint(vocab, (1,), generator=g)))
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"batch": batch, "context": context, "vocab": vocab, "steps": steps,
            "count_ms": {k: round(med[f"{k}_count"] * 1e3, 3) for k in ("kept", "rebuilt")},
            "step_ms": {k: round(med[k] * 1e3, 3) for k in ("kept", "rebuilt")},
            "count_kept_over_rebuilt": round(med["kept_count"] / med["rebuilt_count"], 4),
            "step_kept_over_rebuilt": round(med["kept"] / med["rebuilt"], 3)}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.sampling penalty-overhead", description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=49152, help="SmolLM2's")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    res = study(args.batch, args.context, args.vocab, args.steps)
    print(json.dumps(res) if args.json else
          f"batch {res['batch']} x {res['context']} tokens: counting kept {res['count_ms']['kept']} ms, rebuilt "
          f"{res['count_ms']['rebuilt']} ms ({res['count_kept_over_rebuilt']}x); apply_controls kept "
          f"{res['step_ms']['kept']} ms, rebuilt {res['step_ms']['rebuilt']} ms")
    return 0
