"""Model load benchmark: pdorch's streamed loader against `safetensors.torch.load_file` + `load_state_dict`.

The checkpoint: random weights of Qwen2.5-0.5B's shape (24 layers, hidden 896, vocab 151936, tied
embeddings) in bfloat16, ~0.99 GB, built once by transformers (pdorch/local_stack/hf_checkpoints.py) into --dir.
Each load runs in a fresh process (page cache warm, read once before the runs), --runs times, ours
and the baseline alternating; medians. Measured per load:

  load_s            wall time of the load call
  peak_over_base    peak RSS (VmHWM, reset just before the load) minus the RSS before it, in bytes
  model_bytes       bytes of the loaded parameters; on CPU they are host memory themselves, on a GPU not
  overhead          peak_over_base - model_bytes: host memory the load needed beyond its destination,
                    which is all the host memory a GPU load needs. Target: <= 0.25 x checkpoint bytes.

  ours_bf16         load_model(dir, dtype=bfloat16): the destination is the checkpoint's size
  ours_fp32         load_model(dir, dtype=float32): what `model.dtype: auto` does on CPU (2x the checkpoint)
  baseline_bf16     transformers' model skeleton (meta device, then to_empty: uninitialised, like ours),
                    safetensors.torch.load_file of the whole file, load_state_dict (copy)

    python bench/engine/model_load.py [--json] [--runs 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

METHODS = ("ours_bf16", "ours_fp32", "baseline_bf16")


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def child(method: str, model_dir: Path) -> dict:
    """One load in this (fresh) process: what it cost in time and host memory."""
    import torch

    torch.set_num_threads(2)
    if method.startswith("ours"):
        from engine.loader import load_model

        dtype = torch.bfloat16 if method == "ours_bf16" else torch.float32
        load = lambda: load_model(model_dir, dtype=dtype)[1]
    else:
        from safetensors.torch import load_file
        from transformers import AutoConfig, AutoModelForCausalLM

        cfg = AutoConfig.from_pretrained(str(model_dir))

        def load():
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
            model.to_empty(device="cpu")
            model.tie_weights()  # NOTE: to_empty unties: lm_head would be a second (untouched) embedding
            state = load_file(str(model_dir / "model.safetensors"))
            model.load_state_dict(state, strict=False)  # NOTE: tied lm_head is not in the file
            return model

    base = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    t0 = time.perf_counter()
    model = load()
    load_s = time.perf_counter() - t0
    peak = _status("VmHWM")
    params = {p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}
    return {"load_s": load_s, "peak_over_base": peak - base, "model_bytes": sum(params.values())}


def build(model_dir: Path) -> int:
    from pdorch.local_stack.hf_checkpoints import QWEN25_05B, build_checkpoint

    if not (model_dir / "model.safetensors").is_file():
        print(f"[model_load] building a random Qwen2.5-0.5B-shaped bf16 checkpoint in {model_dir} ...",
              file=sys.stderr, flush=True)
        build_checkpoint("qwen2", model_dir, dtype="bfloat16", shape=QWEN25_05B, std=0.02)
    return sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))


def run(model_dir: Path, runs: int) -> dict:
    size = build(model_dir)
    for p in model_dir.glob("*.safetensors"):  # warm the page cache: every method reads from memory
        with open(p, "rb") as f:
            while f.read(64 << 20):
                pass
    results: dict[str, list[dict]] = {m: [] for m in METHODS}
    for _ in range(runs):
        for m in METHODS:
            out = subprocess.run([sys.executable, __file__, "--child", m, "--dir", str(model_dir)], check=True,
                                 capture_output=True, text=True, timeout=600, cwd=ROOT)
            results[m].append(json.loads(out.stdout.strip().splitlines()[-1]))
    summary = {"checkpoint_bytes": size, "runs": runs}
    for m, rs in results.items():
        med = {k: statistics.median(r[k] for r in rs) for k in ("load_s", "peak_over_base", "model_bytes")}
        summary[f"{m}_load_s"] = round(med["load_s"], 3)
        summary[f"{m}_peak_over_base_bytes"] = int(med["peak_over_base"])
        summary[f"{m}_model_bytes"] = int(med["model_bytes"])
        summary[f"{m}_peak_over_base_ratio"] = round(med["peak_over_base"] / size, 3)
        summary[f"{m}_overhead_ratio"] = round((med["peak_over_base"] - med["model_bytes"]) / size, 3)
    summary["load_s_baseline_over_ours_bf16_ratio"] = round(summary["baseline_bf16_load_s"]
                                                             / summary["ours_bf16_load_s"], 2)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/engine/model_load.py", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--runs", type=int, default=3, help="loads per method (median)")
    parser.add_argument("--dir", help="where the checkpoint is built once (default: a temp dir, removed)")
    parser.add_argument("--child", choices=METHODS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, Path(args.dir))))
        return 0
    with tempfile.TemporaryDirectory(prefix="pdorch-model-load-") as tmp:
        summary = run(Path(args.dir) if args.dir else Path(tmp) / "qwen2.5-0.5b-shape", args.runs)
    gb = summary["checkpoint_bytes"] / 1e9
    print(f"checkpoint {gb:.2f} GB (bf16), {summary['runs']} runs, medians")
    print(f"{'method':<15}{'load s':>9}{'peak-base GB':>14}{'model GB':>10}{'peak/ckpt':>11}{'overhead/ckpt':>15}")
    for m in METHODS:
        print(f"{m:<15}{summary[m + '_load_s']:>9.2f}{summary[m + '_peak_over_base_bytes'] / 1e9:>14.2f}"
              f"{summary[m + '_model_bytes'] / 1e9:>10.2f}{summary[m + '_peak_over_base_ratio']:>11.3f}"
              f"{summary[m + '_overhead_ratio']:>15.3f}")
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
