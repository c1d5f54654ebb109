"""The prepared device check of the GPU path, in one command of a few minutes on one H200:

    set -o pipefail; PYTHONUNBUFFERED=1 python3 bench/gpu_check/run.py --json --commit SHA --out KEPT/RESULT.json 2>&1 | tee KEPT/log
    python bench/gpu_check/run.py --smoke --json  # on a CPU: tiny shapes, proves the script runs end to end

It uses only torch, transformers, triton (CUDA) and the project's own source: no Mooncake, no
network, no tokenizer files. Part 1 (seconds): the paged Triton kernels over a grid of shapes, fp32
and bf16, and the decode kernel's bandwidth (bench/gpu_check/kernels.py); part 2: the engine against
transformers (bench/gpu_check/correctness.py); part "devices": a worker's forward on a thread of its
own on cuda:1 (the device selected per thread), and with two GPUs or more TP 2 over NCCL against one
process, eager and with CUDA graphs (bench/gpu_check/devices.py); part 3: speed on
Llama-3.1-8B-shaped random weights (bench/gpu_check/speed.py). The JSON is written to --out after every part (and after each step of
part 3), so a run killed at its time limit keeps what it measured.
Targets (GPU): decode at batch 32 x 4k within 1.5x of the memory roofline, batch 1 and batch 128 x 4k
within 1.3x, prefill at 8k at least HF transformers' tokens/s. Prints a table; --json adds one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch

from bench.gpu_check.correctness import passed, run_correctness
from bench.gpu_check.devices import run_devices
from bench.gpu_check.kernels import decode_bandwidth
from bench.gpu_check.speed import run_speed
from engine.device import use_device
from engine.reference.kernel_checks import run_fused, run_kernels


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
    """The issue's acceptance on speed: decode wall time per step against the memory roofline, prefill
    tokens/s against transformers (None where the row was not measured)."""
    rows = {(r["batch"], r["context"]): r for r in speed.get("decode", [])}
    pf = next((p for p in speed.get("prefill", []) if p["prompt_tokens"] == 8192), None)

    def within(batch: int, limit: float):
        r = rows.get((batch, 4096))
        return None if r is None else r["over_roofline"] <= limit

    return {"decode_b32_4k_within_1_5x_roofline": within(32, 1.5), "decode_b1_4k_within_1_3x_roofline": within(1, 1.3),
            "decode_b128_4k_within_1_3x_roofline": within(128, 1.3),
            "prefill_8k_at_least_hf": None if pf is None else pf["ours_over_hf"] >= 1.0}


def report(res: dict) -> None:
    print(f"device {res['env'].get('gpu', res['env']['device'])}, torch {res['env']['torch']}, "
          f"transformers {res['env']['transformers']}, commit {res['commit']}, {res['elapsed_s']:.0f} s")
    for f in res.get("kernels", {}).get("fused", []):
        err = f"{f['rel_err']:.2e}" if "rel_err" in f else f"raised {f['error']}"
        print(f"fused {f['op']} {f['dtype']}: {err} {'ok' if f['ok'] else 'FAILED'}")
    grid = res.get("kernels", {}).get("grid", [])
    if grid:
        failed = [e for e in grid if not e["ok"]]
        for name in sorted({e["dtype"] for e in grid}):
            worst = max((e for e in grid if e["dtype"] == name and "rel_err" in e), key=lambda e: e["rel_err"],
                        default=None)
            if worst is None:
                print(f"kernel grid {name}: every case raised")
                continue
            print(f"kernel grid {name}: {sum(e['dtype'] == name for e in grid)} cases, worst {worst['rel_err']:.2e} "
                  f"({worst['kernel']}, page {worst['page']}, {worst['heads']}/{worst['kv_heads']} heads, "
                  f"dim {worst['head_dim']})")
        print(f"kernel grid: {len(failed)} failed" + "".join(f"\n  {e}" for e in failed))
    for b in res.get("kernels", {}).get("decode_bandwidth", []):
        print(f"paged_decode alone, batch {b['batch']} x {b['context']}: {b['gbps']:.0f} GB/s, {b['splits']} splits")
    print(f"\n{'family':>8} {'dtype':>9} {'ops':>6} {'logit rel diff':>15} {'tol':>7} {'greedy = HF':>12} {'seeded':>7} "
          f"{'batch':>6} {'bf16/HF':>8} {'pass':>5}")
    for c in res["correctness"]:
        if "error" in c:
            print(f"{c['family']:>8} {c['dtype']:>9} {c['ops']:>6} raised: {c['error'].splitlines()[-1]}")
            continue
        ratio = f"{c['error_over_hf']:>8.2f}" if "error_over_hf" in c else f"{'-':>8}"
        print(f"{c['family']:>8} {c['dtype']:>9} {c['ops']:>6} {c['logits_rel_diff']:>15.2e} {c['logits_tolerance']:>7.0e} "
              f"{c['greedy_token_match']:>12.2f} {c['seeded_reproducible']!s:>7} {c['batch_tokens_equal']!s:>6} "
              f"{ratio} {passed(c)!s:>5}")
    devices = res.get("devices", {})
    if devices:
        pl, tp = devices["placement"], devices["tp2"]
        print(f"\nplacement on {pl['device']}: thread tokens = main thread's {pl['thread_tokens_equal']}, current device "
              f"in a thread that selects it {pl['selected_thread_current_device']}, in one that does not "
              f"{pl['unselected_thread_current_device']}, ok {pl['ok']}")
        if "skipped" in tp:
            print(f"TP 2: {tp['skipped']}")
        else:
            print(f"TP 2 on {tp['devices']}: greedy = TP 1 {tp.get('greedy_equal')}, logits rel diff "
                  f"{tp.get('logits_rel_diff', float('nan')):.1e}; decode batch {tp.get('batch')} x {tp.get('context')}: "
                  f"TP 1 {tp.get('tp1_ms', float('nan')):.2f} ms, TP 2 eager {tp.get('tp2_eager_ms', float('nan')):.2f} ms, "
                  f"graphs {tp.get('tp2_graphs_ms', float('nan')):.2f} ms (= eager: {tp.get('graph_tokens_equal_eager')}), "
                  f"ok {tp['ok']}" + "".join(f"\n  {k}: {v}" for k, v in tp.items() if k.endswith("error")))
    s = res["speed"]
    print(f"\n{s['shape']} bf16, copy bandwidth {s['copy_gbps']:.0f} GB/s, weights read per decode step "
          f"{s['weights_gb_per_step']:.2f} GB, graph capture {s.get('graph_capture_s', 0):.1f} s, "
          f"first-call extra {s['first_call_extra_s']}")
    print(f"prefill attention ops: {s['prefill_attention_ops']}")
    print(f"{'prefill tokens':>15} {'ours tok/s':>11} {'HF tok/s':>10} {'ours / HF':>10}")
    for p in s["prefill"]:
        print(f"{p['prompt_tokens']:>15} {p['ours_tok_s']:>11.0f} {p['hf_tok_s']:>10.0f} {p['ours_over_hf']:>10.2f}")
    print(f"{'batch':>6} {'context':>8} {'GPU ms':>8} {'wall ms':>8} {'roofline ms':>12} {'wall/roof':>10} "
          f"{'HF ms':>8} {'HF/ours':>8} {'stage ms':>9} {'replay ms':>10} {'sampler ms':>11}")
    for d in s["decode"]:
        hf = f"{d['hf_wall_s'] * 1e3:>8.2f} {d['ours_over_hf']:>8.2f}" if d["hf_wall_s"] else f"{'-':>8} {'-':>8}"
        parts = (f"{d['staging_s'] * 1e3:>9.3f} {d['replay_gpu_s'] * 1e3:>10.2f} {d['sampler_s'] * 1e3:>11.3f}"
                 if "staging_s" in d else "")
        print(f"{d['batch']:>6} {d['context']:>8} {d['ours_gpu_s'] * 1e3:>8.2f} {d['ours_wall_s'] * 1e3:>8.2f} "
              f"{d['roofline_s'] * 1e3:>12.2f} {d['over_roofline']:>10.2f} {hf} {parts}")
    for d in s.get("decode_fused", []):
        print(f"fused ops: batch {d['batch']} x {d['context']}: wall {d['ours_wall_s'] * 1e3:.2f} ms, "
              f"{d['over_roofline']:.2f}x the roofline")
    for mode, o in s.get("device_ops", {}).items():
        print(f"{mode} decode step: {o['ops_per_step']:.0f} device ops, {o['device_s'] * 1e3:.2f} ms busy of "
              f"{o['wall_s'] * 1e3:.2f} ms wall (idle {o['idle_fraction']:.0%})")
    b, c = s["profile_at"]
    print(f"\ntop-10 by device time, eager decode step, batch {b} x {c}:")
    for e in s.get("profile", []):
        print(f"  {e['self_ms_per_step']:>8.3f} ms  {e['calls_per_step']:>6.0f}x  {e['name']}")
    print("peak memory GiB per part: " + str(res.get("peak_memory_gib", {})))
    print("\ntargets: " + ", ".join(f"{k}={v}" for k, v in res["targets"].items()))
    if "targets_fused" in res:
        print("targets with the fused kernels: " + ", ".join(f"{k}={v}" for k, v in res["targets_fused"].items()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on any device (CPU CI)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=2, help="torch threads on CPU")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", help="write the JSON object to this file after every part (a killed run keeps them)")
    ap.add_argument("--commit", help="the commit of these files, recorded in the JSON (default: git's HEAD; a "
                                     "machine given a copy of the files without the repository has none)")
    args = ap.parse_args(argv)
    cuda = args.device.startswith("cuda")
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    elif not args.smoke and not cuda:
        ap.error("the full check needs a CUDA device; use --smoke elsewhere")
    use_device(args.device)
    t0 = time.perf_counter()
    res = {"env": environment(args.device), "smoke": args.smoke, "commit": args.commit or commit(), "part_s": {}}
    dtypes = ("float32",) if args.smoke else ("float32", "bfloat16")
    if cuda:
        res["preflight_error"] = triton_preflight(args.device)
        if res["preflight_error"]:  # NOTE: every part needs Triton: stop in seconds, not after minutes of failures
            print(res["preflight_error"], flush=True)
            if args.out:
                Path(args.out).write_text(json.dumps(res, default=float, indent=1))
            return 2

    def save() -> None:
        res["elapsed_s"] = time.perf_counter() - t0
        if args.out:  # NOTE: replaced whole, never half written: the run may be killed at any moment
            tmp = Path(args.out + ".part")
            tmp.write_text(json.dumps(res, default=float, indent=1))
            os.replace(tmp, args.out)

    def kernels() -> dict:
        if not cuda:
            return {"skipped": "needs CUDA (on CPU the grid runs in Triton's interpreter: "
                               "tests/unit/test_triton_kernels.py)"}
        out = {}  # NOTE: each step kept as it ends: one that raises loses only itself
        for step, fn in (("grid", lambda: run_kernels(args.device, dtypes)), ("fused", lambda: run_fused(args.device, dtypes)),
                         ("decode_bandwidth", lambda: decode_bandwidth(args.device))):
            try:
                out[step] = fn()
            except Exception:  # noqa: BLE001
                out[f"{step}_error"] = traceback.format_exc()[-3000:]
                print(out[f"{step}_error"], flush=True)
        return out

    # NOTE: a part that raises is reported (traceback in the JSON) and the next part still runs: the
    # check gets one run on a GPU machine. Each part is saved as soon as it ends; speed also saves
    # after each of its own steps (it fills res["speed"] as it goes).
    parts = (("kernels", kernels), ("correctness", lambda: run_correctness(args.device, dtypes)),
             ("devices", lambda: run_devices(args.device, args.smoke)),
             ("speed", lambda: run_speed(args.device, args.smoke, res.setdefault("speed", {}), save)))
    for name, part in parts:
        print(f"gpu_check: {name} ...", flush=True)
        start = time.perf_counter()
        try:
            res[name] = part()
        except Exception:  # noqa: BLE001
            res[f"{name}_error"] = traceback.format_exc()[-3000:]
            print(res[f"{name}_error"], flush=True)
        res["part_s"][name] = time.perf_counter() - start
        if cuda:
            res.setdefault("peak_memory_gib", {})[name] = torch.cuda.max_memory_allocated() / 2**30
            torch.cuda.reset_peak_memory_stats()
        save()
    res.setdefault("correctness", [])
    devices = res.get("devices", {})
    res["devices_passed"] = "devices_error" not in res and devices.get("placement", {}).get("ok", False) and \
        devices.get("tp2", {}).get("ok", True)
    res["correctness_passed"] = bool(res["correctness"]) and all(passed(c) for c in res["correctness"])
    grid = res["kernels"].get("grid", []) + res["kernels"].get("fused", []) if "kernels" in res else []
    res["kernels_passed"] = (all(e["ok"] for e in grid) and "kernels_error" not in res
                             and not any(k.endswith("_error") for k in res.get("kernels", {})))
    if "speed_error" not in res:
        res["targets"] = targets(res["speed"])
        if res["speed"].get("decode_fused"):
            res["targets_fused"] = targets({**res["speed"], "decode": res["speed"]["decode_fused"]})
    save()
    if "speed_error" not in res:
        report(res)
    if args.json:
        print(json.dumps(res, default=float))
    ok = res["correctness_passed"] and res["kernels_passed"] and res["devices_passed"] and "speed_error" not in res
    return 0 if ok else 1


def triton_preflight(device: str) -> str | None:
    """None when a Triton kernel compiles and runs here; else why not. Triton builds its launcher with
    the host's C compiler against Python's headers at the first launch: a machine without them fails
    every kernel."""
    from engine import fused_kernels

    try:
        gate_up = torch.ones(2, 64, device=device)
        y = fused_kernels.silu_mul(gate_up, 32)
        torch.cuda.synchronize()
        want = torch.nn.functional.silu(gate_up[:, :32]) * gate_up[:, 32:]
        return None if torch.allclose(y, want) else f"Triton preflight: silu_mul gave {y[0, :4].tolist()}"
    except Exception:  # noqa: BLE001
        return "Triton preflight failed (a C compiler and Python.h are needed at the first launch):\n" + \
            traceback.format_exc()[-2000:]


def commit() -> str:
    """The commit this check ran on (recorded beside its numbers), or "unknown" outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             timeout=10, check=False)
    except OSError:
        return "unknown"
    return out.stdout.strip() or "unknown"

if __name__ == "__main__":
    sys.exit(main())
