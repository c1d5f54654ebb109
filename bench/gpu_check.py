"""The prepared device check of the GPU path: correctness against transformers, then speed on
Llama-3.1-8B-shaped random weights, in one command of a few minutes on one H200.

    python3 bench/gpu_check.py --json --out RESULT.json   # on the GPU machine (CUDA torch, transformers, Triton)
    python bench/gpu_check.py --smoke --json  # on a CPU: tiny shapes, proves the script runs end to end

It uses only torch, transformers, triton (CUDA) and the project's own source: no Mooncake, no
network, no tokenizer files. Part 1: bench/gpu_check_correctness.py; part 2: bench/gpu_check_speed.py.
Targets (GPU): decode at batch 32 x 4k within 1.5x of the memory roofline, batch-1 decode within
1.3x, prefill at 8k at least HF transformers' tokens/s. Prints a table; --json adds one JSON line.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch

from bench.gpu_check_correctness import passed, run_correctness
from bench.gpu_check_speed import run_speed


def environment(device: str) -> dict:
    import transformers

    env = {"device": device, "python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__, "torch_cuda": torch.version.cuda}
    if device.startswith("cuda"):
        import triton

        env.update(gpu=torch.cuda.get_device_name(device), triton=triton.__version__,
                   gpu_memory_gib=torch.cuda.get_device_properties(device).total_memory / 2**30)
    return env


def targets(speed: dict) -> dict:
    rows = {(r["batch"], r["context"]): r for r in speed["decode"]}
    b32 = rows.get((32, 4096))
    b1 = min((r for (b, _), r in rows.items() if b == 1), key=lambda r: r["over_roofline"], default=None)
    pf = next((p for p in speed["prefill"] if p["prompt_tokens"] == 8192), None)
    return {"decode_b32_4k_within_1_5x_roofline": None if b32 is None else b32["over_roofline"] <= 1.5,
            "decode_b1_within_1_3x_roofline": None if b1 is None else b1["over_roofline"] <= 1.3,
            "prefill_8k_at_least_hf": None if pf is None else pf["ours_over_hf"] >= 1.0}


def report(res: dict) -> None:
    print(f"device {res['env'].get('gpu', res['env']['device'])}, torch {res['env']['torch']}, "
          f"transformers {res['env']['transformers']}, {res['elapsed_s']:.0f} s")
    print(f"\n{'family':>8} {'dtype':>9} {'logit rel diff':>15} {'tol':>7} {'greedy = HF':>12} {'seeded':>7} "
          f"{'mixed':>6} {'pass':>5}")
    for c in res["correctness"]:
        print(f"{c['family']:>8} {c['dtype']:>9} {c['logits_rel_diff']:>15.2e} {c['logits_tolerance']:>7.0e} "
              f"{c['greedy_token_match']:>12.2f} {c['seeded_reproducible']!s:>7} {c['mixed_batch_ok']!s:>6} "
              f"{passed(c)!s:>5}")
    s = res["speed"]
    print(f"\n{s['shape']} bf16, copy bandwidth {s['copy_gbps']:.0f} GB/s, weights read per decode step "
          f"{s['weights_gb_per_step']:.2f} GB")
    print(f"{'prefill tokens':>15} {'ours tok/s':>11} {'HF tok/s':>10} {'ours / HF':>10}")
    for p in s["prefill"]:
        print(f"{p['prompt_tokens']:>15} {p['ours_tok_s']:>11.0f} {p['hf_tok_s']:>10.0f} {p['ours_over_hf']:>10.2f}")
    print(f"{'batch':>6} {'context':>8} {'GPU ms':>8} {'wall ms':>8} {'roofline ms':>12} {'wall/roof':>10} "
          f"{'HF ms':>8} {'HF/ours':>8}")
    for d in s["decode"]:
        hf = f"{d['hf_wall_s'] * 1e3:>8.2f} {d['ours_over_hf']:>8.2f}" if d["hf_wall_s"] else f"{'-':>8} {'-':>8}"
        print(f"{d['batch']:>6} {d['context']:>8} {d['ours_gpu_s'] * 1e3:>8.2f} {d['ours_wall_s'] * 1e3:>8.2f} "
              f"{d['roofline_s'] * 1e3:>12.2f} {d['over_roofline']:>10.2f} {hf}")
    b, c = s["profile_at"]
    print(f"\ntop-10 by device time, eager decode step, batch {b} x {c}:")
    for e in s["profile"]:
        print(f"  {e['self_ms_per_step']:>8.3f} ms  {e['calls_per_step']:>6.0f}x  {e['name']}")
    print("\ntargets: " + ", ".join(f"{k}={v}" for k, v in res["targets"].items()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on any device (CPU CI)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=2, help="torch threads on CPU")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", help="also write the JSON object to this file")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    elif not args.smoke and not args.device.startswith("cuda"):
        ap.error("the full check needs a CUDA device; use --smoke elsewhere")
    t0 = time.perf_counter()
    # Tensor parallelism needs two GPUs or more: its check is the gloo test on CPU
    # (tests/unit/test_engine_tensor_parallel.py), never this one-GPU run.
    res = {"env": environment(args.device), "smoke": args.smoke,
           "tensor_parallel": "not measured: this check runs on one GPU (TP needs two or more)"}
    # NOTE: a part that raises is reported (traceback in the JSON) and the next part still runs: the
    # check gets one run on a GPU machine.
    try:
        res["correctness"] = run_correctness(args.device, ("float32",) if args.smoke else ("float32", "bfloat16"))
    except Exception:  # noqa: BLE001
        res["correctness"], res["correctness_error"] = [], traceback.format_exc()[-3000:]
    try:
        res["speed"] = run_speed(args.device, args.smoke)
        res["targets"] = targets(res["speed"])
    except Exception:  # noqa: BLE001
        res["speed_error"] = traceback.format_exc()[-3000:]
    res["correctness_passed"] = bool(res["correctness"]) and all(passed(c) for c in res["correctness"])
    res["elapsed_s"] = time.perf_counter() - t0
    for key in ("correctness_error", "speed_error"):
        if key in res:
            print(f"{key}:\n{res[key]}")
    if "speed" in res:
        report(res)
    if args.out:
        Path(args.out).write_text(json.dumps(res, default=float, indent=1))
    if args.json:
        print(json.dumps(res, default=float))
    return 0 if res["correctness_passed"] and "speed_error" not in res else 1


if __name__ == "__main__":
    sys.exit(main())
