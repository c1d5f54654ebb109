"""bench/gpu_check.py, part 2: speed on random weights of Llama-3.1-8B's shape (bf16), same run, same weights.

    copy       device-to-device copy bandwidth (bytes read + written / time): the memory ceiling
    prefill    tokens/s of one prompt (2k, 8k) through our ModelRunner vs HF transformers (sdpa)
    decode     one step at batch B x context C: our engine (CUDA graphs on, sampler included: the
               step a worker runs) vs (a) the roofline = (weights read + KV read) / copy bandwidth and
               (b) HF's decode step with its DynamicCache holding C tokens; GPU time (events) and wall time
    profile    torch.profiler top-10 by device time of eager decode steps at one (B, C)

The engine's weights are HF's, copied in by the loader's own name map (engine/loader.destinations).
"""

from __future__ import annotations

import gc
import inspect
import statistics
import time
import traceback

import torch

from engine.arch import ModelArch
from engine.attention.batch import Chunk
from engine.kv_pool import KVPool
from engine.loader import destinations
from engine.model import DecoderModel
from engine.model_runner import ModelRunner
from engine.sampler import Sampler
from engine.sampling_params import SamplingParams

LLAMA31_8B = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256, "max_position_embeddings": 131072,
              "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
              "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
TINY = {**LLAMA31_8B, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512}
PAGE = 64


class Clock:
    """Device time by CUDA events (host time on CPU) and wall time of one call, both in seconds."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def time(self, fn) -> tuple[float, float]:
        if not self.cuda:
            t0 = time.perf_counter()
            fn()
            t = time.perf_counter() - t0
            return t, t
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3, time.perf_counter() - t0

    def median(self, fn, reps: int, warmup: int = 2) -> tuple[float, float]:
        for _ in range(warmup):
            fn()
        runs = [self.time(fn) for _ in range(reps)]
        return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def copy_bandwidth(device: torch.device, nbytes: int) -> float:
    """Bytes read + written per second by a large device-to-device copy (median of 10)."""
    a = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    b = torch.empty_like(a)
    t, _ = Clock(device).median(lambda: b.copy_(a), 10)
    return 2 * nbytes / t


def build_models(shape: dict, device: torch.device):
    """(HF LlamaForCausalLM, our DecoderModel, ModelArch) with the same random bf16 weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**shape)
    torch.manual_seed(0)
    with torch.device(device):
        hf = LlamaForCausalLM._from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa").eval()
    arch = ModelArch.from_config({**cfg.to_dict(), "architectures": ["LlamaForCausalLM"]})
    ours = DecoderModel(arch, torch.bfloat16, device)
    state = hf.state_dict()
    with torch.no_grad():
        for name, dst in destinations(ours, arch).items():  # one process (tp_size 1): every block is whole
            dst.tensor.copy_(state[name])
    return hf, ours, arch


def weight_bytes_per_step(arch: ModelArch) -> int:
    """Bytes of weights one decode step reads: every matrix and norm but the embedding table (only B rows)."""
    a = arch
    q, kv = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
    layer = a.hidden_size * (q + 2 * kv) + q * a.hidden_size + 3 * a.hidden_size * a.intermediate_size
    return 2 * (a.num_layers * (layer + 2 * a.hidden_size) + a.vocab_size * a.hidden_size + a.hidden_size)


def hf_call_kwargs(hf, cache) -> dict:
    """transformers renamed past_key_values to cache (5.x): pass whichever this version takes."""
    name = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
    return {name: cache, "use_cache": True}


def prefill(runner, hf, clock, lengths, reps: int) -> list[dict]:
    out = []
    for n in lengths:
        ids = torch.randint(10, min(1000, runner.arch.vocab_size), (n,)).tolist()
        chunk = Chunk(list(range(-(-n // PAGE))), 0, ids)
        x = torch.tensor([ids], device=runner.device)
        ours, _ = clock.median(lambda c=chunk: runner.forward([c]), reps)
        with torch.inference_mode():
            theirs, _ = clock.median(lambda x=x: hf(x, use_cache=False, logits_to_keep=1), reps)
        out.append({"prompt_tokens": n, "ours_tok_s": n / ours, "hf_tok_s": n / theirs, "ours_over_hf": theirs / ours})
    return out


def decode(runner, clock, arch, batches, contexts, copy_bps, reps: int) -> list[dict]:
    sampler, greedy = Sampler(runner.device), SamplingParams(temperature=0)
    per_token = arch.kv_values_per_token * 2  # bf16 bytes of K and V of one token, all layers
    out = []
    for b in batches:
        for c in contexts:
            width = c // PAGE + 1
            chunks = [Chunk(list(range(i * width, (i + 1) * width)), c, [7]) for i in range(b)]

            def step(chunks=chunks, b=b):
                return sampler.sample(runner.forward(chunks), [greedy] * b)

            gpu, wall = clock.median(step, reps)
            roof = (weight_bytes_per_step(arch) + b * c * per_token) / copy_bps
            out.append({"batch": b, "context": c, "ours_gpu_s": gpu, "ours_wall_s": wall, "roofline_s": roof,
                        "over_roofline": wall / roof})
    return out


def hf_decode(hf, clock, arch, batches, contexts, reps: int, budget_bytes: int) -> dict[tuple[int, int], float]:
    """HF decode step time per (B, C) whose DynamicCache fits twice in budget_bytes (it grows by concat)."""
    from transformers import DynamicCache

    dev, out = hf.device, {}
    per_token = arch.kv_values_per_token * 2
    for b in batches:
        for c in contexts:
            if 2 * b * c * per_token > budget_bytes:
                continue
            cache = DynamicCache(config=hf.config)
            for layer in range(arch.num_layers):
                shape = (b, arch.num_kv_heads, c, arch.head_dim)
                cache.update(torch.randn(shape, dtype=torch.bfloat16, device=dev),
                             torch.randn(shape, dtype=torch.bfloat16, device=dev), layer)
            x = torch.full((b, 1), 7, device=dev)
            with torch.inference_mode():
                def step(x=x, cache=cache):
                    return hf(input_ids=x, **hf_call_kwargs(hf, cache)).logits[:, -1].argmax(-1).tolist()

                out[(b, c)] = clock.median(step, reps)[1]
            del cache
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    return out


def profile_top10(runner, batch: int, context: int) -> list[dict]:
    """Top-10 ops by device time (CPU time on CPU) over 5 eager decode steps."""
    from torch.profiler import ProfilerActivity, profile

    width = context // PAGE + 1
    chunks = [Chunk(list(range(i * width, (i + 1) * width)), context, [7]) for i in range(batch)]
    graphs, runner.graphs = runner.graphs, None  # eager: the kernels, not one graph replay
    cuda = runner.device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    try:
        runner.forward(chunks)
        with profile(activities=acts) as prof:
            for _ in range(5):
                runner.forward(chunks)
            if cuda:
                torch.cuda.synchronize()
    finally:
        runner.graphs = graphs
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, key, 0), reverse=True)[:10]
    return [{"name": e.key[:60], "self_ms_per_step": getattr(e, key, 0) / 1e3 / 5, "calls_per_step": e.count / 5}
            for e in events]


def run_speed(device: str, smoke: bool) -> dict:
    dev = torch.device(device)
    clock = Clock(dev)
    shape = TINY if smoke else LLAMA31_8B
    lengths, batches, contexts = ((64, 128), (1, 2), (32, 64)) if smoke else ((2048, 8192), (1, 8, 32, 128),
                                                                           (1024, 4096))
    reps = 3 if smoke else 10
    copy_bps = copy_bandwidth(dev, (64 << 20) if smoke else (4 << 30))
    hf, ours, arch = build_models(shape, dev)
    tokens = max(max(batches) * (max(contexts) // PAGE + 1) * PAGE, max(lengths) + PAGE)
    pool = KVPool(arch, tokens // PAGE + 1, PAGE, torch.bfloat16, dev, scratch_page=True)
    pool.tensor.normal_()  # never zeros: timing on zeros flatters
    runner = ModelRunner(ours, arch, pool, "paged")
    res = {"shape": "tiny" if smoke else "Llama-3.1-8B", "copy_gbps": copy_bps / 1e9,
           "weights_gb_per_step": weight_bytes_per_step(arch) / 1e9}
    res["prefill"] = prefill(runner, hf, clock, lengths, 2 if not smoke else 1)
    if dev.type == "cuda":
        t0 = time.perf_counter()
        try:  # NOTE: one run on a GPU machine: a failed capture is reported, the eager numbers still come
            runner.capture_decode_graphs(max(batches), max(contexts) + PAGE)
            res["graph_capture_s"] = time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001
            res["graph_capture_error"] = f"{type(e).__name__}: {e}"
            runner.graphs = None
    res["decode"] = decode(runner, clock, arch, batches, contexts, copy_bps, reps)
    res["profile"] = profile_top10(runner, batches[min(2, len(batches) - 1)], contexts[-1])
    res["profile_at"] = [batches[min(2, len(batches) - 1)], contexts[-1]]
    runner.graphs = None  # NOTE: the graphs hold the runner (a cycle): break it, or the pool outlives `del`
    del runner, pool
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info(dev)
        budget = int(free * 0.9)
    else:
        budget = 1 << 40
    try:
        theirs = hf_decode(hf, clock, arch, batches, contexts, reps, budget)
    except Exception:  # noqa: BLE001 - reported; our numbers stand without HF's
        res["hf_decode_error"] = traceback.format_exc()[-2000:]
        theirs = {}
    for row in res["decode"]:
        t = theirs.get((row["batch"], row["context"]))
        row["hf_wall_s"] = t
        row["ours_over_hf"] = None if t is None else t / row["ours_wall_s"]
    return res
