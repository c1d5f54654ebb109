"""Engine benchmark: our paged torch engine next to Hugging Face transformers, same machine, same run.

  prefill   one prompt of 128 / 512 / 2048 random tokens: our ModelRunner (fresh pages) vs the HF
            forward that `generate` does first (use_cache=True, logits for the last token only).
            Headline: hf_time / our_time (>= 0.83 means we are within 1.2x of HF).
  decode    B sequences of --prompt-len tokens, --new-tokens greedy steps, B = 1, 8, 32: our LLM
            engine (continuous batching, sampler and stop checks included) vs HF's generate loop
            (forward with its KV cache + argmax) at batch 1 = requests run sequentially (the
            baseline) and at the same batch (context); the two step alternately. tok/s = B /
            median step time. `decode_b1_hf_generate_tok_s` times HF `generate` itself (between
            its logits-processor calls) as a cross-check of the baseline.

Prefill runs are repeated --reps times, ours and HF interleaved so machine noise hits both; the
best run is kept. Medians and minimums make the ratios stable on a shared, busy machine.
Weights: SmolLM2-135M-Instruct prepared by `pdorch model prepare` (HF loads the same directory).

    python bench/engine/run.py [--json] [--threads 2] [--reps 4]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch

from engine.kv_pool import KVPool
from engine.llm import LLM
from engine.model_runner import Chunk, ModelRunner
from engine.prepare import DEFAULT_CACHE_DIR, prepare_model
from engine.sampling_params import SamplingParams


def best_time(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def random_ids(n: int, seed: int, batch: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, 40000, (batch, n), generator=g).tolist()


def bench_prefill(llm: LLM, hf, lengths, reps: int) -> dict:
    out = {}
    page = 16
    pool = KVPool(llm.arch, -(-max(lengths) // page), page)
    runner = ModelRunner(llm.model, llm.arch, pool, llm.runner.attention.name)
    for n in lengths:
        ids = random_ids(n, seed=n)[0]
        pages = list(range(-(-n // page)))
        x, chunk = torch.tensor([ids]), Chunk(pages, 0, ids)
        ours_t, hf_t = [], []
        for i in range(reps):  # interleaved, alternating who goes first
            for side in ((0, 1) if i % 2 == 0 else (1, 0)):
                if side == 0:
                    ours_t.append(best_time(lambda c=chunk: runner.forward([c]), 1))
                else:
                    with torch.inference_mode():
                        hf_t.append(best_time(lambda x=x: hf(x, use_cache=True, logits_to_keep=1), 1))
        o, h = min(ours_t), min(hf_t)
        out.update({f"prefill_{n}_ours_s": o, f"prefill_{n}_hf_s": h, f"prefill_{n}_ours_tok_s": n / o,
                    f"prefill_{n}_hf_tok_s": n / h, f"prefill_{n}_hf_over_ours_ratio": h / o})
    return out


def hf_step_times(hf, prompts, new_tokens: int) -> list[float]:
    """Wall time of each decode step inside HF `generate`: the gaps between its logits-processor
    calls (one per generated token; the first follows the prefill)."""
    from transformers import LogitsProcessor, LogitsProcessorList

    stamps: list[float] = []

    class Stamp(LogitsProcessor):
        def __call__(self, input_ids, scores):
            stamps.append(time.perf_counter())
            return scores

    x = torch.tensor(prompts)
    with torch.inference_mode():
        hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                    do_sample=False, pad_token_id=2, logits_processor=LogitsProcessorList([Stamp()]))
    return [b - a for a, b in itertools.pairwise(stamps)]


def lockstep_decode(llm: LLM, hf, prompts, new_tokens: int) -> tuple[list[float], list[float]]:
    """Per-step wall times of our engine and of HF's generate loop, stepped alternately.

    HF side = what `generate` does per token: one forward with its KV cache, greedy argmax.
    NOTE: alternating single steps makes a burst of load from other processes hit both sides.
    """
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    seqs = [llm.add_request(p, params) for p in prompts]
    llm.step()  # prefill of every prompt (the token budget covers them all) + first token
    assert all(s.num_computed_tokens == s.prompt_len for s in seqs), "prefill did not fit one step"
    with torch.inference_mode():
        out = hf(torch.tensor(prompts), use_cache=True, logits_to_keep=1)
        cache, nxt = out.cache, out.logits[:, -1].argmax(-1, keepdim=True)
        ours, theirs = [], []
        while llm.has_unfinished():
            t0 = time.perf_counter()
            llm.step()
            t1 = time.perf_counter()
            out = hf(nxt, cache=cache, use_cache=True)
            cache, nxt = out.cache, out.logits[:, -1].argmax(-1, keepdim=True)
            ours.append(t1 - t0)
            theirs.append(time.perf_counter() - t1)
    return ours, theirs


def bench_decode(llm: LLM, hf, batches, prompt_len: int, new_tokens: int) -> dict:
    """Tokens/s = batch / median step time: robust to the bursts of load a shared machine has."""
    out = {}
    for b in batches:
        prompts = random_ids(prompt_len, seed=1000 + b, batch=b)
        llm.allocator.flush()  # no prefix-cache hits from earlier runs
        ours, theirs = (statistics.median(t) for t in lockstep_decode(llm, hf, prompts, new_tokens))
        out[f"decode_b{b}_ours_step_s"] = ours
        out[f"decode_b{b}_hf_step_s"] = theirs
        out[f"decode_b{b}_ours_tok_s"] = b / ours
        out[f"decode_b{b}_hf_tok_s"] = b / theirs
        out[f"decode_b{b}_over_hf_same_batch_ratio"] = theirs / ours
    if 1 in batches:
        seq = out["decode_hf_sequential_tok_s"] = out["decode_b1_hf_tok_s"]
        for b in batches:
            out[f"decode_b{b}_over_hf_ratio"] = out[f"decode_b{b}_ours_tok_s"] / seq
        # cross-check of the HF baseline: HF `generate` itself at batch 1, steps timed inside it
        prompts = random_ids(prompt_len, seed=1001)
        out["decode_b1_hf_generate_tok_s"] = 1 / statistics.median(hf_step_times(hf, prompts, new_tokens))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2", help="model source for `prepare_model`")
    ap.add_argument("--cache-dir", default=DEFAULT_CACHE_DIR)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=4, help="prefill repetitions (best kept)")
    ap.add_argument("--prefill-lengths", default="128,512,2048")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--attention", default="auto", help="attention backend: auto, torch (the reference), paged")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    model_dir = prepare_model(args.model, args.cache_dir, progress=lambda m: print(m, file=sys.stderr))
    lengths = [int(x) for x in args.prefill_lengths.split(",")]
    batches = [int(x) for x in args.batches.split(",")]
    per_seq_pages = -(-(args.prompt_len + args.new_tokens) // 16)
    llm = LLM(model_dir, num_pages=max(batches) * per_seq_pages + 1, page_size=16, max_num_seqs=max(batches),
              max_num_batched_tokens=max(batches) * args.prompt_len, attention=args.attention)
    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    res = {"attention": llm.runner.attention.name, "torch_threads": args.threads, "decode_prompt_len_tokens": args.prompt_len,
           "decode_new_tokens": args.new_tokens, "load_avg_1m_before": os.getloadavg()[0]}
    # NOTE: the first forward of each pays one-off costs (allocator, kernel selection): not measured.
    llm.generate(random_ids(32, seed=1), SamplingParams(temperature=0, max_tokens=2))
    with torch.inference_mode():
        hf(torch.tensor(random_ids(32, seed=1)), use_cache=True, logits_to_keep=1)
    res.update(bench_prefill(llm, hf, lengths, args.reps))
    res.update(bench_decode(llm, hf, batches, args.prompt_len, args.new_tokens))

    res["load_avg_1m_after"] = os.getloadavg()[0]  # context: other processes share these cores
    print(f"{'prefill tokens':>16} {'ours tok/s':>11} {'HF tok/s':>10} {'HF time / ours':>15}")
    for n in lengths:
        print(f"{n:>16} {res[f'prefill_{n}_ours_tok_s']:>11.0f} {res[f'prefill_{n}_hf_tok_s']:>10.0f} "
              f"{res[f'prefill_{n}_hf_over_ours_ratio']:>15.2f}")
    print(f"{'decode batch':>16} {'ours tok/s':>11} {'HF tok/s':>10} {'ours / HF b1':>15} {'ours / HF same b':>17}")
    for b in batches:
        print(f"{b:>16} {res[f'decode_b{b}_ours_tok_s']:>11.1f} {res[f'decode_b{b}_hf_tok_s']:>10.1f} "
              f"{res.get(f'decode_b{b}_over_hf_ratio', float('nan')):>15.2f} "
              f"{res[f'decode_b{b}_over_hf_same_batch_ratio']:>17.2f}")
    if args.json:
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in res.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
