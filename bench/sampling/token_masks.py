"""The request's token masks (engine/token_masks.py: allowed_token_ids, bad_words, min_tokens, each only
where it leaves a token) and the sampler's no-token check: what they add to a sampler step.

  B rows of random logits over the vocabulary, sampled (temperature 0.7) by Sampler.sample, 16 of them
  with a mask, the others plain; the variants take turns step by step so machine noise hits all
  alike. Median milliseconds per step: none (no row masked: the baseline), logit_bias (one id: the
  control, apply_controls' copy and gather of the rows without a mask, as min_tokens cost before its
  masks became layers), min_tokens (EOS held back), allowed_token_ids (64 ids), bad_words (8 words,
  2 tokens each, every one banned: the output ends with each word's first token), all three; and the
  no-token check alone (its ops on the same logits). Headline: each / none, each mask / logit_bias.

    python -m bench.sampling token-masks [--json] [--batch 32] [--steps 40]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from engine.sampler import Sampler, TokenHistory
from engine.sampling_params import SamplingParams

EOS = 2
MASKED = 16


def variants(vocab: int) -> dict[str, SamplingParams]:
    words = tuple((7, 100 + i) for i in range(8))  # every history ends with 7: all 8 last tokens banned
    return {"none": SamplingParams(temperature=0.7),
            "logit_bias": SamplingParams(temperature=0.7, logit_bias={EOS: -1.0}),
            "min_tokens": SamplingParams(temperature=0.7, min_tokens=10_000),
            "allowed_token_ids": SamplingParams(temperature=0.7, allowed_token_ids=tuple(range(0, vocab, vocab // 64))),
            "bad_words": SamplingParams(temperature=0.7, bad_words=words),
            "all": SamplingParams(temperature=0.7, min_tokens=10_000, bad_words=words,
                                  allowed_token_ids=tuple(range(0, vocab, vocab // 64)))}


def study(batch: int, vocab: int, steps: int) -> dict:
    g = torch.Generator().manual_seed(0)
    history = TokenHistory([5] * 200 + [7], 100, stop_ids=(EOS,))
    plain = SamplingParams(temperature=0.7)
    sampler = Sampler()
    times: dict[str, list[float]] = {name: [] for name in [*variants(vocab), "check"]}
    for step in range(steps + 3):  # 3 warm-up steps
        logits = torch.randn(batch, vocab, generator=g)
        for name, p in variants(vocab).items():
            params = [p] * MASKED + [plain] * (batch - MASKED)
            x = logits.clone()
            t0 = time.perf_counter()
            sampler.sample(x, params, None, None, [history] * batch)
            if step >= 3:
                times[name].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        torch.where((logits > float("-inf")).any(-1), logits.argmax(-1), -1).tolist()
        if step >= 3:
            times["check"].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    return {"batch": batch, "masked_rows": MASKED, "vocab": vocab, "steps": steps,
            "step_ms": {k: round(v, 3) for k, v in med.items()},
            "over_none": {k: round(v / med["none"], 3) for k, v in med.items() if k != "none"},
            "over_logit_bias": {k: round(med[k] / med["logit_bias"], 3)
                                for k in ("min_tokens", "allowed_token_ids", "bad_words", "all")}}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.sampling token-masks", description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=49152, help="SmolLM2's")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    res = study(args.batch, args.vocab, args.steps)
    print(json.dumps(res) if args.json else
          "; ".join(f"{k} {v} ms" for k, v in res["step_ms"].items())
          + f" (each / none: {res['over_none']}; each / logit_bias: {res['over_logit_bias']})")
    return 0
