"""Penalties (repetition, frequency, presence) on a decode batch: what they cost a step when each request
keeps its token counts (engine/sampler.py TokenCounts: a step counts its new tokens only) against the
control, the counts rebuilt from every row's whole history each step (what a caller without
TokenCounts gets, and what every decode step did before).

  B rows with histories of `context` tokens (the last 100 output), each step appends one token per
  row; the two variants take turns step by step on the same logits, so machine noise hits both alike.
  Median milliseconds of apply_controls per step; headline: kept / rebuilt.

    python -m bench.sampling penalty-overhead [--json] [--batch 32] [--context 4096] [--steps 30]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from engine.sampler import TokenCounts, TokenHistory, apply_controls
from engine.sampling_params import SamplingParams


def study(batch: int, context: int, vocab: int, steps: int) -> dict:
    g = torch.Generator().manual_seed(0)
    histories = [torch.randint(vocab, (context,), generator=g).tolist() for _ in range(batch)]
    params = [SamplingParams(temperature=0.7, presence_penalty=0.5, frequency_penalty=0.5, repetition_penalty=1.1)] * batch
    counts = [TokenCounts() for _ in range(batch)]
    start = context - 100
    times: dict[str, list[float]] = {"kept": [], "rebuilt": []}
    for step in range(steps + 3):  # 3 warm-up steps (the first one counts every history for "kept" too)
        logits = torch.randn(batch, vocab, generator=g)
        for kind, spent in times.items():
            hist = [TokenHistory(h, start, counts=c if kind == "kept" else None) for h, c in zip(histories, counts)]
            t0 = time.perf_counter()
            apply_controls(logits, params, hist)
            if step >= 3:
                spent.append(time.perf_counter() - t0)
        for h in histories:
            h.append(int(torch.randint(vocab, (1,), generator=g)))
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"batch": batch, "context": context, "vocab": vocab, "steps": steps,
            "step_ms": {k: round(v * 1e3, 3) for k, v in med.items()},
            "kept_over_rebuilt": round(med["kept"] / med["rebuilt"], 3)}


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
          f"batch {res['batch']} x {res['context']} tokens: kept {res['step_ms']['kept']} ms, rebuilt "
          f"{res['step_ms']['rebuilt']} ms a step ({res['kept_over_rebuilt']}x)")
    return 0
