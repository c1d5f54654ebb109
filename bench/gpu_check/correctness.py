"""bench/gpu_check/run.py, part 2: the engine against transformers on tiny random checkpoints.

Per family (Llama 3, Qwen2; pdorch/local_stack/hf_checkpoints.py's build_checkpoint) and dtype (fp32, bf16):

    logits    the engine's last-token logits of 3 prompts, each prefilled in two chunks (the second on
              top of the first's cached pages: the extend path), against HF's forward of the whole
              prompt in the same dtype: |diff|max / |ref|max within LOGIT_TOLERANCE (a gate in fp32);
              bf16 also against HF in fp32: our RMS error over HF bf16's own, at most BF16_ERROR_OVER_HF
    greedy    24 greedy tokens of the 3 prompts decoded in one batch (paged decode, and CUDA graphs
              on a GPU) equal HF `generate` run per prompt: required in fp32, reported in bf16
    seeded    a seeded request draws the same tokens twice, and after its generator state is moved to a
              new generator mid-stream (the prefill -> decode hand-off)
    batch     the same prompts inside a batch mixing greedy, seeded and unseeded rows: the same tokens
              (a gate in fp32), prompt 1's logits against those of the first batch (reported in bf16:
              cuBLAS promises no bitwise equality across batch shapes)
"""

from __future__ import annotations

import pathlib
import tempfile
import traceback

import torch

from engine.attention.batch import Chunk
from engine.fused_ops import OPS
from engine.kv_pool import KVPool
from engine.loader import load_model
from engine.model_runner import ModelRunner
from engine.sampler import Sampler
from engine.sampling_params import SamplingParams

LOGIT_TOLERANCE = {"float32": 1e-4, "bfloat16": 5e-2}  # relative to the largest |logit| of the reference
BF16_ERROR_OVER_HF = 1.25  # bf16: our error against HF fp32 over HF's own bf16 error against it
FAMILIES = ("llama3", "qwen2", "qwen3")  # qwen3: per-head q/k RMSNorm before RoPE
PAGE = 16
STEPS = 24


def build_tiny(family: str, root: pathlib.Path) -> pathlib.Path:
    # NOTE: the GPU machine has no SmolLM2 package to build a tokenizer from; these checks compare token ids
    # and logits only.
    from pdorch.local_stack.hf_checkpoints import build_checkpoint

    return build_checkpoint(family, root / family, seed=7, tokenizer=False)


class Engine:
    """The engine's parts driven directly: contiguous pages per sequence, two-chunk prefill, decode."""

    def __init__(self, model_dir, device, dtype, graphs: bool, ops: str = "torch"):
        self.arch, self.model = load_model(model_dir, device=device, dtype=dtype)
        self.model.ops = OPS[ops]  # engine/fused_ops.py: torch, or the fused Triton kernels
        self.pool = KVPool(self.arch, 256, PAGE, dtype, device, scratch_page=True)
        self.runner = ModelRunner(self.model, self.arch, self.pool, "paged")
        self.graph_error = None
        if graphs:
            try:  # NOTE: reported, not fatal: the eager path's correctness still gets measured
                self.runner.capture_decode_graphs(8, 1024)
            except Exception as e:  # noqa: BLE001
                self.graph_error = f"{type(e).__name__}: {e}"
        self.sampler = Sampler(self.model.device)

    def run(self, prompts, params, steps=STEPS, handoff_at: int | None = None):
        """(prefill last-token logits [n, vocab], generated ids per prompt)."""
        tables, first = [], 0
        for p in prompts:
            n = -(-(len(p) + steps) // PAGE)
            tables.append(list(range(first, first + n)))
            first += n
        gens = [self.sampler.make_generator(sp) for sp in params]
        halves = [len(p) // 2 for p in prompts]
        self.runner.forward([Chunk(t, 0, p[:h]) for t, p, h in zip(tables, prompts, halves)])
        logits = self.runner.forward([Chunk(t, h, p[h:]) for t, p, h in zip(tables, prompts, halves)])
        seqs = [list(p) for p in prompts]
        out = [[] for _ in prompts]
        step_logits = logits
        for step in range(steps):
            if step == handoff_at:  # what the decode worker does with the prefill worker's state
                gens = [None if g is None else _moved(g, self.sampler.device) for g in gens]
            toks = self.sampler.sample(step_logits, params, gens)
            for s, o, t in zip(seqs, out, toks):
                s.append(t)
                o.append(t)
            if step + 1 < steps:
                step_logits = self.runner.forward([Chunk(t, len(s) - 1, [s[-1]]) for t, s in zip(tables, seqs)])
        return logits, out


def _moved(gen, device):
    fresh = torch.Generator(device=device)
    fresh.set_state(gen.get_state())
    return fresh


def hf_reference(model_dir, device, dtype, prompts):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype, attn_implementation="sdpa")
    hf = hf.to(device).eval()
    logits, greedy = [], []
    with torch.inference_mode():
        for p in prompts:
            x = torch.tensor([p], device=device)
            logits.append(hf(x).logits[0, -1].float())
            ids = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=STEPS, min_new_tokens=STEPS,
                              do_sample=False, pad_token_id=0)
            greedy.append(ids[0, len(p):].tolist())
    del hf
    return torch.stack(logits), greedy


def check_family(family: str, dtype_name: str, device: str, model_dir: pathlib.Path, prompts, hf32, graphs: bool,
                 ops: str = "torch", hf_same=None) -> dict:
    """One (family, dtype, ops) entry; `hf32`: HF's fp32 (logits, greedy ids), the reference of every dtype;
    `hf_same`: HF's in this dtype, if already computed."""
    dtype = getattr(torch, dtype_name)
    if hf_same is None:
        hf_same = hf32 if dtype_name == "float32" else hf_reference(model_dir, device, dtype, prompts)
    ref_logits, ref_greedy = hf_same
    eng = Engine(model_dir, device, dtype, graphs, ops)
    greedy = SamplingParams(temperature=0)
    logits, ours = eng.run(prompts, [greedy] * len(prompts))
    rel = relative(logits, ref_logits)
    seeded = SamplingParams(seed=1234, temperature=0.8, top_p=0.9, top_k=50, min_p=0.02)
    _, alone = eng.run(prompts[:1], [seeded])
    _, again = eng.run(prompts[:1], [seeded])
    _, handoff = eng.run(prompts[:1], [seeded], handoff_at=1)
    mixed_params = [greedy, seeded, SamplingParams(temperature=1.0), SamplingParams(seed=99, top_p=0.8)]
    mixed_logits, mixed = eng.run([prompts[1], prompts[0], prompts[2], prompts[1]], mixed_params)
    vocab = eng.arch.vocab_size
    batch_diff = relative(mixed_logits[0], logits[1])  # prompt 1's logits in a batch of 4 vs of 3
    entry = {
        "family": family, "dtype": dtype_name, "ops": ops, "logits_rel_diff": rel, "logits_tolerance": LOGIT_TOLERANCE[dtype_name],
        "logits_ok": rel <= LOGIT_TOLERANCE[dtype_name],
        "greedy_equal": ours == ref_greedy,
        "greedy_token_match": sum(a == b for o, r in zip(ours, ref_greedy) for a, b in zip(o, r)) / (3 * STEPS),
        "seeded_reproducible": alone == again == handoff,
        "batch_tokens_equal": mixed[1] == alone[0] and mixed[0] == ours[1] and all(0 <= t < vocab for t in mixed[2]),
        "batch_logits_rel_diff": batch_diff, "batch_logits_ok": batch_diff <= LOGIT_TOLERANCE[dtype_name],
        "cuda_graphs": graphs and eng.graph_error is None, "cuda_graph_error": eng.graph_error,
    }
    if dtype_name != "float32":  # our bf16 error against HF fp32, over HF's own bf16 error against it
        ours_err, hf_err = rms_error(logits, hf32[0]), rms_error(ref_logits, hf32[0])
        entry.update(error_vs_fp32=ours_err, hf_error_vs_fp32=hf_err, error_over_hf=ours_err / max(hf_err, 1e-12),
                     max_error_over_hf=relative(logits, hf32[0]) / max(relative(ref_logits, hf32[0]), 1e-12))
    return entry


def relative(x: torch.Tensor, ref: torch.Tensor) -> float:
    """max |x - ref| / max |ref|."""
    return float((x.float() - ref.float()).abs().max() / ref.float().abs().max())


def rms_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    """root-mean-square of x - ref over root-mean-square of ref (every logit of every prompt)."""
    ref = ref.float()
    return float((x.float() - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt())


def run_correctness(device: str, dtypes=("float32", "bfloat16")) -> list[dict]:
    """Every family and dtype with the torch ops; on CUDA also with the fused Triton kernels (TritonOps)."""
    graphs = device.startswith("cuda")
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, 2000, (n,), generator=g).tolist() for n in (37, 100, 260)]
    out = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        for family in FAMILIES:
            model_dir = build_tiny(family, pathlib.Path(tmp))
            hf32 = hf_reference(model_dir, device, torch.float32, prompts)
            for d in dtypes:
                hf_same = hf32 if d == "float32" else hf_reference(model_dir, device, getattr(torch, d), prompts)
                for ops in ("torch", "triton") if graphs else ("torch",):
                    try:  # NOTE: one entry that raises is reported as failed; the others still run
                        out.append(check_family(family, d, device, model_dir, prompts, hf32, graphs, ops, hf_same))
                    except Exception:  # noqa: BLE001
                        out.append({"family": family, "dtype": d, "ops": ops, "error": traceback.format_exc()[-2000:]})
    return out


def passed(entry: dict) -> bool:
    """fp32: logits within 1e-4 of HF, greedy tokens equal, batch composition changes no token. bf16: its
    error against HF fp32 at most BF16_ERROR_OVER_HF x HF's own bf16 error; batch invariance is reported
    only (cuBLAS promises no bitwise equality across batch shapes). Seeded sampling reproducible in both."""
    if "error" in entry:  # it raised
        return False
    if entry["dtype"] == "float32":
        return entry["logits_ok"] and entry["greedy_equal"] and entry["batch_tokens_equal"] and entry["seeded_reproducible"]
    return entry["error_over_hf"] <= BF16_ERROR_OVER_HF and entry["seeded_reproducible"]
