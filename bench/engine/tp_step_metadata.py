"""What a tensor-parallel step's batch costs to send from rank 0 to a follower: the pickled chunks over
broadcast_object_list (the replaced way) against tp_wire's delta words over the CPU group's broadcast
(pdorch/worker/tp_steps.py StepChannel), on a steady decode batch whose rows advance one token a step
and enter a new page every page_size steps.

    python -m bench.engine.tp_step_metadata [--steps 200] [--json]

Per (batch, context, page): bytes a step and rank 0's host time to make them (medians over the steps,
in one process), then the whole hand-off, rank 0's send until the follower has the step's chunks
(two processes over gloo on loopback; medians of `--steps` steps, each round trip acknowledged).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import pathlib
import pickle
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engine.attention.batch import Chunk
from pdorch.worker.tp_wire import StepDecoder, StepEncoder

CASES = [(32, 4096, 16), (128, 4096, 16), (32, 4096, 64), (128, 4096, 64)]


class Batch:
    """A steady decode batch: each row's page list grows in place as the scheduler's does."""

    def __init__(self, batch: int, context: int, page: int):
        self.page = page
        self.rows = [[list(range(i * 10_000, i * 10_000 + -(-context // page))), context - i % page]
                     for i in range(batch)]

    def step(self) -> list[Chunk]:
        out = []
        for row in self.rows:
            pages, length = row
            if length % self.page == 0:
                pages.append(pages[-1] + 1)
            out.append(Chunk(pages, length, [length % 50_000]))
            row[1] += 1
        return out


def host_costs(batch: int, context: int, page: int, steps: int) -> dict:
    b = Batch(batch, context, page)
    enc = StepEncoder()
    enc.forward(b.step())
    pick_s, pick_b, word_s, word_b = [], [], [], []
    for _ in range(steps):
        chunks = b.step()
        t0 = time.perf_counter()
        data = pickle.dumps(("forward", chunks))
        pick_s.append(time.perf_counter() - t0)
        pick_b.append(len(data))
        t0 = time.perf_counter()
        words = enc.forward(chunks)
        word_s.append(time.perf_counter() - t0)
        word_b.append(8 * len(words))
    med = statistics.median
    return {"pickle_ms": med(pick_s) * 1e3, "pickle_bytes": med(pick_b), "words_ms": med(word_s) * 1e3,
            "words_bytes": med(word_b)}


def _rank(rank: int, init: str, case, steps: int, out) -> None:
    import torch

    from engine.tensor_parallel import init_tp_group
    from pdorch.worker.tp_steps import StepChannel

    torch.set_num_threads(1)
    group = init_tp_group(rank, 2, init, "gloo", 120)
    channel = StepChannel(group, lambda e: None)
    ack = torch.zeros(1)
    res = {}
    for name in ("pickle", "words"):
        b, enc, dec, times = Batch(*case), StepEncoder(), StepDecoder(), []
        for i in range(steps + 5):
            chunks = b.step()
            t0 = time.perf_counter()
            if name == "pickle":
                box = [("forward", chunks)] if rank == 0 else [None]
                torch.distributed.broadcast_object_list(box, src=0, group=group.cpu_pg)
                got = box[0][1]
            elif rank == 0:
                channel.send(enc.forward(chunks))
                got = chunks
            else:
                got = dec.decode(channel.receive()).chunks
            torch.distributed.all_reduce(ack, group=group.cpu_pg)  # the follower has it: one round trip
            if i >= 5:
                times.append(time.perf_counter() - t0)
            assert len(got) == len(chunks)
        res[f"{name}_handoff_ms"] = statistics.median(times) * 1e3
    if rank == 0:
        out.put(res)
    group.close()


def handoff(case, steps: int) -> dict:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=_rank, args=(r, f"file://{tmp}/rdv", case, steps, out)) for r in range(2)]
        for p in procs:
            p.start()
        res = out.get(timeout=300)
        for p in procs:
            p.join(60)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = []
    for batch, context, page in CASES:
        row = {"batch": batch, "context": context, "page": page, **host_costs(batch, context, page, args.steps),
               **handoff((batch, context, page), args.steps)}
        rows.append(row)
        print(f"batch {batch:>3} x {context} page {page:>2}: pickle {row['pickle_bytes']:>8.0f} B {row['pickle_ms']:.3f} ms, "
              f"words {row['words_bytes']:>6.0f} B {row['words_ms']:.3f} ms; hand-off over gloo: pickle "
              f"{row['pickle_handoff_ms']:.3f} ms, words {row['words_handoff_ms']:.3f} ms", flush=True)
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
