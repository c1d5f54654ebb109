"""bench/gpu_check/run.py, part 3: speed on random weights of Llama-3.1-8B's shape (bf16), same run, same weights.

    copy       device-to-device copy bandwidth (bytes read + written / time): the memory ceiling
    prefill    tokens/s of one prompt (2k, 8k) through our ModelRunner vs HF transformers (sdpa), and
               which attention ops (SDPA backend) our prefill ran
    decode     one step at batch B x context C: our engine (CUDA graphs on, sampler included: the
               step a worker runs) vs (a) the roofline = (weights read + KV read) / copy bandwidth and
               (b) HF's decode step with its DynamicCache holding C tokens; GPU time (events) and wall
               time, and the step's parts with graphs: host staging, graph replay (GPU), sampler
    profile    torch.profiler top-10 by device time of eager decode steps at one (B, C); device ops per
               step and their time against the step's wall time, eager and graph replay (idle gaps)
    compile    the first call's extra time (Triton compiles) of a decode and an extend step; graph capture
    fused      decode at batch 1, 32, 128 x 4k and the device ops per step again with the fused elementwise
               kernels (engine/fused_ops.py TritonOps): the measurement that chooses them or not

The engine's weights are HF's, copied in by the loader's own name map (engine/loader.destinations).
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import statistics
import time
import traceback

import torch

from engine.arch import ModelArch
from engine.attention.batch import Chunk
from engine.fused_ops import TorchOps, TritonOps
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
    """Per (B, C): the step a worker runs (CUDA graphs where captured, the sampler included), GPU and wall
    time against the roofline; on CUDA with graphs also its parts (step_parts)."""
    sampler, greedy = Sampler(runner.device), SamplingParams(temperature=0)
    per_token = arch.kv_values_per_token * 2  # bf16 bytes of K and V of one token, all layers
    out = []
    for b in batches:
        for c in contexts:
            chunks, params = decode_chunks(b, c), [greedy] * b

            def step(chunks=chunks, params=params):
                return sampler.sample(runner.forward(chunks), params)

            gpu, wall = clock.median(step, reps)
            roof = (weight_bytes_per_step(arch) + b * c * per_token) / copy_bps
            row = {"batch": b, "context": c, "ours_gpu_s": gpu, "ours_wall_s": wall, "roofline_s": roof,
                   "over_roofline": wall / roof}
            if runner.graphs is not None and runner.graphs.can_run(chunks):
                row.update(step_parts(runner, sampler, chunks, params, reps))
            out.append(row)
    return out


def decode_chunks(batch: int, context: int) -> list[Chunk]:
    width = context // PAGE + 1
    return [Chunk(list(range(i * width, (i + 1) * width)), context, [7]) for i in range(batch)]


def step_parts(runner, sampler, chunks, params, reps: int) -> dict:
    """Medians of a graph step's parts: host staging (the rows into the pinned buffer, the copy and the
    page-table cells enqueued), graph replay on the GPU (events), the sampler (GPU work and its one
    sync, from the replay's end to the tokens on the host)."""
    g, runs = runner.graphs, []
    for i in range(reps + 2):
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        b = g.stage(chunks)
        t1 = time.perf_counter()
        ev[0].record()
        logits = g.replay(b, len(chunks))
        ev[1].record()
        sampler.sample(logits, params)
        ev[2].record()
        t2 = time.perf_counter()
        torch.cuda.synchronize()
        if i >= 2:  # warm-up: the first staging of these rows sends the whole table
            runs.append((t1 - t0, ev[0].elapsed_time(ev[1]) / 1e3, ev[1].elapsed_time(ev[2]) / 1e3, t2 - t0))
    med = [statistics.median(r[k] for r in runs) for k in range(4)]
    return {"staging_s": med[0], "replay_gpu_s": med[1], "sampler_s": med[2], "step_wall_s": med[3]}


def first_call_extra(runner, clock, chunks) -> float:
    """Seconds the first forward of these chunks took beyond a later one: Triton's compile of a new launch
    shape (the kernels are cached on disk: a warm cache shows ~0)."""
    first = clock.time(lambda: runner.forward(chunks))[1]
    return first - clock.median(lambda: runner.forward(chunks), 3, warmup=0)[1]


def device_ops(runner, chunks, steps: int = 5) -> dict:
    """Device ops (kernels, copies) per step, their summed time and the step's wall time, from the
    profiler: wall - device time = the GPU's idle gaps (launch overhead, host work)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    runner.forward(chunks)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            runner.forward(chunks)
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / steps
    ops = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    busy = sum(getattr(e, "device_time", None) or getattr(e, "cuda_time", 0) for e in ops) / 1e6 / steps
    return {"ops_per_step": len(ops) / steps, "device_s": busy, "wall_s": wall, "idle_fraction": max(0.0, 1 - busy / wall)}


def sdpa_kernels(runner, n: int) -> list[str]:
    """The attention ops a prefill of n tokens ran (which SDPA backend torch picked)."""
    from torch.profiler import ProfilerActivity, profile

    chunk = Chunk(list(range(-(-n // PAGE))), 0, [7] * n)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        runner.forward([chunk])
    keys = ("scaled_dot_product", "flash_attention", "efficient_attention", "cudnn_attention")
    return sorted({e.key for e in prof.key_averages() if any(k in e.key for k in keys)})


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


def fused_steps(runner, clock, arch, batches, contexts, copy_bps, reps: int, res: dict) -> None:
    """Decode at 4k context with TritonOps (graphs captured again), and its device ops per step."""
    model, at = runner.model, res["profile_at"]
    try:
        model.ops = TritonOps
        if runner.graphs is not None:
            runner.graphs = None
            gc.collect()
            runner.capture_decode_graphs(max(batches), max(contexts) + PAGE)
        res["decode_fused"] = decode(runner, clock, arch, [b for b in batches if b in (1, 32, 128)], contexts[-1:],
                                     copy_bps, reps)
        with eager(runner):
            res["device_ops"]["eager_fused"] = device_ops(runner, decode_chunks(*at))
        if runner.graphs is not None:
            res["device_ops"]["graph_fused"] = device_ops(runner, decode_chunks(*at))
    except Exception:  # noqa: BLE001 - reported; the torch-ops numbers stand
        res["fused_error"] = traceback.format_exc()[-2000:]
    finally:
        model.ops = TorchOps


def profile_top10(runner, batch: int, context: int) -> list[dict]:
    """Top-10 ops by device time (CPU time on CPU) over 5 eager decode steps."""
    from torch.profiler import ProfilerActivity, profile

    chunks = decode_chunks(batch, context)
    cuda = runner.device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with eager(runner):
        runner.forward(chunks)
        with profile(activities=acts) as prof:
            for _ in range(5):
                runner.forward(chunks)
            if cuda:
                torch.cuda.synchronize()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, key, 0), reverse=True)[:10]
    return [{"name": e.key[:60], "self_ms_per_step": getattr(e, key, 0) / 1e3 / 5, "calls_per_step": e.count / 5}
            for e in events]


@contextlib.contextmanager
def eager(runner):
    """The runner without its CUDA graphs for a while: the kernels, not one graph replay."""
    graphs, runner.graphs = runner.graphs, None
    try:
        yield
    finally:
        runner.graphs = graphs


def run_speed(device: str, smoke: bool, res: dict | None = None, save=lambda: None) -> dict:
    """Fills `res` step by step, calling save() after each (a run killed at its time limit keeps them)."""
    res = {} if res is None else res
    dev = torch.device(device)
    clock, cuda = Clock(dev), dev.type == "cuda"
    shape = TINY if smoke else LLAMA31_8B
    lengths, batches, contexts = ((64, 128), (1, 2), (32, 64)) if smoke else ((2048, 8192), (1, 8, 32, 128),
                                                                           (1024, 4096))
    reps = 3 if smoke else 10
    copy_bps = copy_bandwidth(dev, (64 << 20) if smoke else (4 << 30))
    hf, ours, arch = build_models(shape, dev)
    if cuda:  # NOTE: batch 128 x 4k is 68 GB of KV on 8B: on a smaller GPU than an H200 the largest batches go
        fits = [b for b in batches if b * (max(contexts) // PAGE + 2) * PAGE * arch.kv_values_per_token * 2
                < 0.8 * torch.cuda.mem_get_info(dev)[0]]
        res["batches_left_out"], batches = [b for b in batches if b not in fits], tuple(fits)
    tokens = max(max(batches) * (max(contexts) // PAGE + 1) * PAGE, max(lengths) + PAGE)
    pool = KVPool(arch, tokens // PAGE + 1, PAGE, torch.bfloat16, dev, scratch_page=True)
    pool.tensor.normal_()  # never zeros: timing on zeros flatters
    runner = ModelRunner(ours, arch, pool, "paged")
    res.update(shape="tiny" if smoke else "Llama-3.1-8B", copy_gbps=copy_bps / 1e9,
               weights_gb_per_step=weight_bytes_per_step(arch) / 1e9)
    res["first_call_extra_s"] = {
        "decode": first_call_extra(runner, clock, decode_chunks(batches[0], contexts[0])),
        "extend": first_call_extra(runner, clock, [Chunk(list(range(-(-(contexts[0] + 64) // PAGE))), contexts[0],
                                                         [7] * 64)])}
    res["prefill"] = prefill(runner, hf, clock, lengths, 2 if not smoke else 1)
    res["prefill_attention_ops"] = sdpa_kernels(runner, lengths[-1])
    save()
    if cuda:
        t0 = time.perf_counter()
        try:  # NOTE: one run on a GPU machine: a failed capture is reported, the eager numbers still come
            runner.capture_decode_graphs(max(batches), max(contexts) + PAGE)
            res["graph_capture_s"] = time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001
            res["graph_capture_error"] = f"{type(e).__name__}: {e}"
            runner.graphs = None
    res["decode"] = decode(runner, clock, arch, batches, contexts, copy_bps, reps)
    save()
    at = [batches[min(2, len(batches) - 1)], contexts[-1]]
    res["profile_at"], res["device_ops"] = at, {}
    try:  # NOTE: a profiler failure is reported; the fused-ops and HF numbers still come
        res["profile"] = profile_top10(runner, *at)
        if cuda:
            with eager(runner):
                res["device_ops"]["eager"] = device_ops(runner, decode_chunks(*at))
            if runner.graphs is not None:
                res["device_ops"]["graph"] = device_ops(runner, decode_chunks(*at))
    except Exception:  # noqa: BLE001
        res["profile_error"] = traceback.format_exc()[-2000:]
    save()
    if cuda:  # the same steps with the fused elementwise kernels (engine/fused_ops.py): which one to use
        fused_steps(runner, clock, arch, batches, contexts, copy_bps, reps, res)
        save()
    runner.graphs = None  # NOTE: the graphs hold the runner (a cycle): break it, or the pool outlives `del`
    del runner, pool
    gc.collect()
    if cuda:
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
