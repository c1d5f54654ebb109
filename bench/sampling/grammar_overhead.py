"""Structured outputs and sampling controls: what they add to a decode step, same run, same model.

  step      B = 32 decode rows of SmolLM2 (one forward + the sampler), steps of five kinds taken in
            turn so machine noise hits all alike: none constrained; 16 of the 32 rows under a JSON
            schema (engine/grammar.py: the batched mask, each matcher advancing, reset when its
            output completes); 16 rows under a forced tool call's structural tag (issue 51: the call
            in SmolLM2's family format, Llama 3.1's JSON, its arguments under the same schemas;
            router/http/tool_grammar.py); 16 rows inside a reasoning model's thinking, before that
            call's grammar (free text up to </think>, its mask still filled every step); 16 rows with
            presence + frequency + repetition penalties (the counts rebuilt from each row's tokens,
            engine/sampler.py apply_controls). Median step times, and the mask fill alone
            (mask_rows); headline: constrained / none (target <= 1.1 for every grammar).
  compile   B = 8 unconstrained rows stepping on the main thread (the scheduler) while another
            thread (a worker's RPC thread) makes 8 grammars of new schemas (600 properties each), each compiled on the
            compile thread, as a worker does; step time p99 with the compiles / without (target
            <= 1.2). The control: the same steps while another process keeps one core busy (no GIL
            shared, no grammar): what any CPU work beside the step costs on this machine.

    python -m bench.sampling grammar-overhead [--json] [--steps 40] [--threads 2] [--step-only]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import threading
import time

import torch

from engine.grammar import Grammars, mask_rows
from engine.kv_pool import KVPool
from engine.loader import load_model
from engine.model_runner import Chunk, ModelRunner
from engine.prepare import DEFAULT_CACHE_DIR, prepare_model
from engine.sampler import Sampler, TokenHistory
from engine.sampling_params import GrammarSpec, SamplingParams
from router.http.reasoning import INSIDE
from router.http.tool_grammar import after_thinking, call_tag, calls_format, structural_tag

PAGE = 16
PROMPT = 96


def schema(seed: int, fields: int = 12) -> str:
    """An object schema of `fields` bounded properties (names differ per seed: no cache hit)."""
    rng = random.Random(seed)
    props = {}
    for i in range(fields):
        name = f"f{seed}_{i}_" + "".join(rng.choice("abcdefgh") for _ in range(4))
        props[name] = rng.choice([{"type": "boolean"}, {"enum": ["low", "mid", "high"]},
                                  {"type": "integer", "minimum": 0, "maximum": 99},
                                  {"type": "string", "maxLength": 12}])
    return json.dumps({"type": "object", "properties": props, "required": list(props),
                       "additionalProperties": False})


class Batch:
    """B sequences decoding one token a step on a real model (prompts prefilled once)."""

    def __init__(self, runner: ModelRunner, b: int, vocab: int):
        self.runner, self.b = runner, b
        self.pages = [list(range(i * 64, (i + 1) * 64)) for i in range(b)]
        g = torch.Generator().manual_seed(0)
        self.tokens = [torch.randint(100, vocab - 100, (PROMPT,), generator=g).tolist() for _ in range(b)]
        with torch.inference_mode():
            for i in range(b):
                runner.forward([Chunk(self.pages[i], 0, self.tokens[i])])

    def forward(self) -> torch.Tensor:
        chunks = [Chunk(self.pages[i], len(t) - 1, [t[-1]]) for i, t in enumerate(self.tokens)]
        with torch.inference_mode():
            return self.runner.forward(chunks)

    def append(self, tokens: list[int]) -> None:
        for t, tok in zip(self.tokens, tokens):
            t.append(tok)
            if len(t) >= 60 * PAGE:  # keep within the pages: start the sequence over
                del t[PROMPT:]


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def step_study(runner, vocab: int, grammars: Grammars, steps: int) -> dict:
    batch = Batch(runner, 32, vocab)
    sampler = Sampler()
    specs = [GrammarSpec("json_schema", schema(s)) for s in range(4)]
    tags = [structural_tag(calls_format("llama3_json", [call_tag("llama3_json", f"tool_{s}", json.loads(schema(s)))],
                                        one=True)) for s in range(4)]
    specs_tag = [GrammarSpec(t.kind, t.spec) for t in tags]
    specs_think = [GrammarSpec("structural_tag", after_thinking(t, INSIDE).spec) for t in tags]
    free = [SamplingParams(temperature=0.7, seed=i) for i in range(32)]
    penal = [SamplingParams(temperature=0.7, seed=i, presence_penalty=0.5, frequency_penalty=0.5,
                            repetition_penalty=1.1) if i % 2 else free[i] for i in range(32)]
    matchers = {"grammar": [grammars.start(specs[i % 4], [], 60) if i % 2 else None for i in range(32)],
                "structural_tag": [grammars.start(specs_tag[i % 4], [], 60) if i % 2 else None for i in range(32)],
                "thinking": [grammars.start(specs_think[i % 4], [], 60) if i % 2 else None for i in range(32)]}
    of_kind = {"grammar": specs, "structural_tag": specs_tag, "thinking": specs_think}
    fill: dict[str, list[float]] = {k: [] for k in matchers}
    gens = [sampler.make_generator(p) for p in free]

    def run(kind: str, measure_fill: bool = False) -> None:
        logits = batch.forward()
        if kind == "none":
            tokens = sampler.sample(logits, free, gens)
        elif kind in matchers:
            rows = matchers[kind]
            for i, m in enumerate(rows):
                if m is not None and m.terminated:  # a finished output: a new request under the grammar
                    rows[i] = grammars.start(of_kind[kind][i % 4], [], 60)
            if measure_fill:  # the mask alone (sample() masks again: the same mask, idempotent)
                fill[kind].append(timed(lambda: mask_rows(logits, rows)))
            tokens = sampler.sample(logits, free, gens, rows)
        else:
            hist = [TokenHistory(t, PROMPT) if p.needs_history else None for t, p in zip(batch.tokens, penal)]
            tokens = sampler.sample(logits, penal, gens, None, hist)
        batch.append(tokens)

    times: dict[str, list[float]] = {"none": [], "grammar": [], "structural_tag": [], "thinking": [], "penalties": []}
    for _ in range(3):  # warm-up
        for kind in times:
            run(kind)
    for _ in range(steps):
        for kind, spent in times.items():
            spent.append(timed(lambda kind=kind: run(kind)))
    for _ in range(steps):  # apart from the timed steps
        for kind in fill:
            run(kind, measure_fill=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"step_ms": {k: round(v * 1e3, 2) for k, v in med.items()},
            "grammar_over_none": round(med["grammar"] / med["none"], 3),
            "structural_tag_over_none": round(med["structural_tag"] / med["none"], 3),
            "thinking_over_none": round(med["thinking"] / med["none"], 3),
            "mask_fill_ms": {k: round(statistics.median(v) * 1e3, 2) for k, v in fill.items()},
            "penalties_over_none": round(med["penalties"] / med["none"], 3)}


def compile_study(runner, vocab: int, grammars: Grammars, steps: int, seed0: int) -> dict:
    batch = Batch(runner, 8, vocab)
    sampler = Sampler()
    params = [SamplingParams(temperature=0.7, seed=i) for i in range(8)]
    gens = [sampler.make_generator(p) for p in params]

    def stepping(n: int) -> list[float]:
        out = []
        for _ in range(n):
            out.append(timed(lambda: batch.append(sampler.sample(batch.forward(), params, gens))))
        return out

    def p99(xs: list[float]) -> float:
        return sorted(xs)[min(len(xs) - 1, int(0.99 * len(xs)))]

    quiet, busy, burnt, compile_s = [], [], [], []
    stepping(3)
    for r in range(3):  # alternate: quiet window, window with 8 new schemas compiling, the control
        quiet += stepping(steps)
        done = threading.Event()

        def compiles(r=r, done=done) -> None:
            for k in range(8):
                compile_s.append(timed(lambda k=k: grammars.start(GrammarSpec("json_schema",
                                                                             schema(seed0 + 100 * r + k, 600)), [], 60)))
            done.set()

        t = threading.Thread(target=compiles, name="rpc-thread")
        t.start()
        window = []
        while not done.is_set():
            window += stepping(1)
        t.join(60)
        busy += window
        # the control: another process keeps one core busy for as many steps (no GIL, no grammar)
        burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            burnt += stepping(len(window))
        finally:
            burner.kill()
            burner.wait(10)
    return {"steps_quiet": len(quiet), "steps_while_compiling": len(busy),
            "itl_p99_ms_one_core_busy": round(p99(burnt) * 1e3, 2),
            "p99_one_core_busy_over_quiet": round(p99(burnt) / p99(quiet), 3),
            "itl_p99_ms": {"quiet": round(p99(quiet) * 1e3, 2), "compiling": round(p99(busy) * 1e3, 2)},
            "itl_median_ms": {"quiet": round(statistics.median(quiet) * 1e3, 2),
                              "compiling": round(statistics.median(busy) * 1e3, 2)},
            "p99_compiling_over_quiet": round(p99(busy) / p99(quiet), 3),
            "compile_ms_median": round(statistics.median(compile_s) * 1e3, 2)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.sampling grammar-overhead", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--step-only", action="store_true", help="the step study alone (no compile study)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model_dir = prepare_model("smollm2", DEFAULT_CACHE_DIR)
    arch, model = load_model(model_dir, device="cpu", dtype=torch.float32)
    pool = KVPool(arch, 32 * 64, PAGE, torch.float32, "cpu")
    runner = ModelRunner(model, arch, pool, "auto")
    grammars = Grammars(model_dir, arch.vocab_size)
    try:
        out = {"step": step_study(runner, arch.vocab_size, grammars, args.steps)}
        if not args.step_only:
            out["compile"] = compile_study(runner, arch.vocab_size, grammars, args.steps, seed0=1000)
    finally:
        grammars.close()
    if args.json:
        print(json.dumps(out))
        return
    s = out["step"]
    print(f"decode step, B=32 (ms): none {s['step_ms']['none']}, 16 rows under a schema {s['step_ms']['grammar']} "
          f"({s['grammar_over_none']}x), 16 rows under a forced call's structural tag "
          f"{s['step_ms']['structural_tag']} ({s['structural_tag_over_none']}x), 16 rows thinking before it "
          f"{s['step_ms']['thinking']} ({s['thinking_over_none']}x), 16 rows with penalties "
          f"{s['step_ms']['penalties']} ({s['penalties_over_none']}x); mask fill alone (ms): {s['mask_fill_ms']}")
    if "compile" not in out:
        return
    c = out["compile"]
    print(f"B=8 step p99 (ms): quiet {c['itl_p99_ms']['quiet']}, while 8 new schemas compile "
          f"{c['itl_p99_ms']['compiling']} ({c['p99_compiling_over_quiet']}x), while another process keeps a core "
          f"busy {c['itl_p99_ms_one_core_busy']} ({c['p99_one_core_busy_over_quiet']}x); compile median "
          f"{c['compile_ms_median']} ms")

