"""bench/gpu_check/run.py, part "devices": where a worker's work runs, and tensor parallelism across GPUs.

    placement  a worker on cuda:1 (cuda:0 on a one-GPU machine) runs its forward on a thread of its own,
               as the scheduler loop does: the thread selects the device first (engine/device.py
               device_initializer); its logits equal the main thread's, and a thread that does not
               select it starts on device 0 (recorded: what the fix is for)
    tp2        with two GPUs or more (gloo on CPU for --smoke): two ranks over NCCL, rank 0's
               GroupRunner sending delta steps over the CPU group (pdorch/worker/tp_steps.py):
               greedy tokens of a batch that changes every step equal one process with the whole model
               (fp32), then decode step time at TP 1 and TP 2, eager and with CUDA graphs captured on
               both ranks and replayed in lockstep (bf16), graph tokens = eager
"""

from __future__ import annotations

import multiprocessing as mp
import pathlib
import queue
import statistics
import tempfile
import threading
import time
import traceback

import torch

from engine.attention.batch import Chunk
from engine.device import device_initializer, use_device
from engine.kv_pool import KVPool
from engine.loader import load_model
from engine.model_runner import ModelRunner
from engine.tensor_parallel import NO_TP, TPShard, init_tp_group

PAGE = 16
TP_TIMEOUT_S = 300.0
# The TP timing model: Llama-shaped, big enough that a step is not all launches (~1.2B parameters).
TP_SHAPE = {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 32000, "max_position_embeddings": 8192}
TINY_SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512, "max_position_embeddings": 4096}


def build(root: pathlib.Path, name: str, shape: dict, dtype: str = "float32") -> pathlib.Path:
    from pdorch.local_stack.hf_checkpoints import build_checkpoint

    return build_checkpoint("llama3", root / name, seed=3, dtype=dtype, shape=shape, tokenizer=False, std=0.3)


def greedy(runner: ModelRunner, vocab: int, steps: int = 12) -> tuple[list[list[int]], torch.Tensor]:
    """Greedy tokens of a batch that changes every step (a request joins every 3 steps with a prefill
    chunk, the oldest leaves every 4 and its pages go to later ones), and all the step logits."""
    gen = torch.Generator().manual_seed(5)
    free, rows, tokens, logits = list(range(255, -1, -1)), [], [], []
    for step in range(steps):
        chunks = [Chunk(r["pages"], r["len"], [r["next"]]) for r in rows]
        if step % 3 == 0:
            prompt = torch.randint(0, vocab, (9 + step,), generator=gen).tolist()
            rows.append({"pages": [free.pop() for _ in range(-(-(len(prompt) + steps) // PAGE))], "len": 0})
            chunks.append(Chunk(rows[-1]["pages"], 0, prompt))
        out = runner.forward(chunks)
        picked = out.argmax(-1).tolist()
        for r, c, t in zip(rows, chunks, picked):
            r["len"], r["next"] = c.end, t
        tokens.append(picked)
        logits.append(out.float().cpu())
        if step % 4 == 3 and len(rows) > 1:
            free += rows.pop(0)["pages"]
    return tokens, torch.cat(logits)


def run_placement(device: str, smoke: bool) -> dict:
    """The forward of a worker on `device` from a thread that selects it first, against the main thread's."""
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build(pathlib.Path(tmp), "tiny", TINY_SHAPE)
        use_device(device)
        _, model = load_model(model_dir, device=device)
        attention = "auto" if smoke else "paged"

        def run() -> list[list[int]]:
            pool = KVPool(model.local_arch, 256, PAGE, torch.float32, device)
            return greedy(ModelRunner(model, model.local_arch, pool, attention), TINY_SHAPE["vocab_size"])

        ref_tokens, ref_logits = run()
        box: dict = {}

        def thread(init) -> None:
            try:
                if init is not None:
                    init()
                box["current"] = torch.cuda.current_device() if device.startswith("cuda") else None
                if init is not None:
                    box["tokens"], box["logits"] = run()
            except Exception:  # noqa: BLE001 - reported
                box["error"] = traceback.format_exc()[-2000:]

        out: dict = {"device": device}
        for name, init in (("unselected", None), ("selected", device_initializer(device))):
            box.clear()
            t = threading.Thread(target=thread, args=(init,))
            t.start()
            t.join(120)
            out[f"{name}_thread_current_device"] = box.get("current")
            if "error" in box:
                out[f"{name}_error"] = box["error"]
        out["thread_tokens_equal"] = box.get("tokens") == ref_tokens
        if "logits" in box:
            out["thread_logits_max_diff"] = float((box["logits"] - ref_logits).abs().max())
        if device.startswith("cuda") and device != "cuda:0":
            out["cuda0_allocated_bytes"] = torch.cuda.memory_allocated(0)  # a worker on cuda:1 puts nothing there
        out["ok"] = out["thread_tokens_equal"] and out.get("cuda0_allocated_bytes", 0) == 0 and (
            not device.startswith("cuda") or out["selected_thread_current_device"] == torch.device(device).index)
        return out


def _decode_chunks(batch: int, context: int) -> list[Chunk]:
    width = context // PAGE + 2
    return [Chunk(list(range(i * width, (i + 1) * width)), context, [7 + i]) for i in range(batch)]


def _step_ms(runner, chunks, reps: int) -> float:
    cuda = runner.device.type == "cuda"
    times = []
    for i in range(reps + 2):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        runner.forward(chunks)
        if cuda:
            torch.cuda.synchronize()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _rank(rank: int, devices: list[str], dirs: dict, init: str, smoke: bool, results) -> None:
    """One TP rank: rank 0 drives (and runs the one-process references on its device), rank 1 follows."""
    try:
        from pdorch.worker.tp_steps import GroupRunner, StepChannel, follow

        device = devices[rank]
        use_device(device)
        cuda = device.startswith("cuda")
        if not cuda:
            torch.set_num_threads(1)  # two ranks on the CPU's cores: spinning OpenMP threads would fight
        group = init_tp_group(rank, 2, init, "nccl" if cuda else "gloo", TP_TIMEOUT_S)
        channel = StepChannel(group, lambda e: None)
        attention = "auto" if smoke else "paged"
        out: dict = {}
        for name, dtype in (("correctness", torch.float32), ("speed", torch.float32 if smoke else torch.bfloat16)):
            _, model = load_model(dirs[name], device=device, dtype=dtype, shard=TPShard(rank, 2), group=group)
            pool = KVPool(model.local_arch, 2400 if name == "speed" else 256, PAGE, dtype, device, scratch_page=cuda)
            if rank == 1:
                follow(channel, ModelRunner(model, model.local_arch, pool, attention))  # until rank 0's STOP
                continue
            runner = GroupRunner(model, model.local_arch, pool, attention, channel)
            _, whole = load_model(dirs[name], device=device, dtype=dtype, shard=NO_TP)
            alone = ModelRunner(whole, whole.arch, KVPool(whole.arch, pool.num_pages, PAGE, dtype, device,
                                                          scratch_page=cuda), attention)
            if name == "correctness":
                tokens, logits = greedy(runner, whole.arch.vocab_size)
                ref_tokens, ref_logits = greedy(alone, whole.arch.vocab_size)
                out["greedy_equal"] = tokens == ref_tokens
                out["logits_rel_diff"] = float((logits - ref_logits).abs().max() / ref_logits.abs().max())
            else:
                batch, context, reps = (4, 64, 3) if smoke else (32, 1024, 20)
                chunks = _decode_chunks(batch, context)
                out.update(batch=batch, context=context, tp1_ms=_step_ms(alone, chunks, reps),
                           tp2_eager_ms=_step_ms(runner, chunks, reps))
                eager = runner.forward(chunks).argmax(-1).tolist()
                if cuda:
                    try:
                        t0 = time.perf_counter()
                        runner.capture_decode_graphs(batch, context + 64)
                        out["tp2_capture_s"] = time.perf_counter() - t0
                        out["tp2_graphs_ms"] = _step_ms(runner, chunks, reps)
                        out["graph_tokens_equal_eager"] = runner.forward(chunks).argmax(-1).tolist() == eager
                    except Exception:  # noqa: BLE001 - reported; the eager numbers stand
                        out["graphs_error"] = traceback.format_exc()[-2000:]
            channel.stop(30)
            channel = StepChannel(group, lambda e: None)  # the next model's steps start afresh
        group.close()
        results.put((rank, out, None))
    except Exception:  # noqa: BLE001 - the parent reports it
        results.put((rank, None, traceback.format_exc()[-3000:]))


def run_tp2(devices: list[str], smoke: bool) -> dict:
    """Two ranks on devices[0] and devices[1] (fresh processes); rank 0's measurements."""
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        dirs = {"correctness": build(root, "tiny", TINY_SHAPE),
                "speed": build(root, "speed", TINY_SHAPE if smoke else TP_SHAPE, "float32" if smoke else "bfloat16")}
        ctx = mp.get_context("spawn")
        results = ctx.Queue()
        procs = [ctx.Process(target=_rank, args=(r, devices, dirs, f"file://{root / 'rendezvous'}", smoke, results),
                             daemon=True) for r in range(2)]
        out: dict = {"devices": devices}
        try:
            for p in procs:
                p.start()
            for _ in procs:
                try:
                    rank, got, error = results.get(timeout=TP_TIMEOUT_S)
                except queue.Empty:
                    out["error"] = f"no answer from a rank within {TP_TIMEOUT_S:.0f} s"
                    break
                if error:
                    out[f"rank{rank}_error"] = error
                elif rank == 0:
                    out.update(got)
        finally:
            for p in procs:
                p.join(10)
                if p.is_alive():
                    p.kill()
        out["ok"] = bool(out.get("greedy_equal")) and out.get("logits_rel_diff", 1.0) <= 1e-4 and \
            out.get("graph_tokens_equal_eager", True) and not any(k.endswith("error") for k in out)
        return out


def run_devices(device: str, smoke: bool) -> dict:
    """The placement check on the second GPU (or the only one), and TP 2 where two GPUs are here."""
    count = torch.cuda.device_count() if device.startswith("cuda") else 0
    out: dict = {"cuda_devices": count}
    out["placement"] = run_placement("cuda:1" if count >= 2 else device if device != "cuda" else "cuda:0", smoke)
    if count >= 2:
        out["tp2"] = run_tp2(["cuda:0", "cuda:1"], smoke)
    elif smoke and not device.startswith("cuda"):
        out["tp2"] = run_tp2(["cpu", "cpu"], smoke)  # the same code path over gloo
    else:
        out["tp2"] = {"skipped": "one GPU: TP 2 needs two (tests/unit/test_tp_steps.py checks it over gloo)"}
    return out
