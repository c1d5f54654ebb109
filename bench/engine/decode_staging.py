"""Host time of staging one CUDA-graph decode step (engine/decode_staging.py), on the CPU.

    python bench/engine/decode_staging.py --json

Per (batch, page size, context): a steady batch decoding (each row one token further a step, a new
page every page_size steps), median of 200 steps. `ours` = DecodeStaging.stage (numpy writes into the
buffer, only the changed page-table cells staged); `control` = what it replaced: a torch tensor per
row written into the staging buffer and the whole table sent every step. Also the bytes each sends
per step (the host-to-device copy). No GPU: the copy itself and the replay are gpu_check's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from engine.attention.batch import Chunk
from engine.decode_staging import DecodeStaging

SHAPES = ((32, 64, 4096), (32, 16, 4096), (128, 64, 4096), (32, 16, 131072))


def control_stage(host: torch.Tensor, chunks, b: int, width: int, page_size: int, scratch: int) -> int:
    """The replaced staging: a tensor per row, the whole [b, width] table in the copy."""
    n = len(chunks)
    ids, pos, pages, lens = (host[i * b:(i + 1) * b] for i in range(4))
    table = host[4 * b:4 * b + b * width].view(b, width)
    id_list, pos_list, page_list = [], [], []
    for i, c in enumerate(chunks):
        p = c.start_pos
        need = p // page_size + 1
        table[i, :need] = torch.tensor(c.page_ids[:need], dtype=torch.int32)
        id_list.append(c.token_ids[0])
        pos_list.append(p)
        page_list.append(c.page_ids[p // page_size])
    pad = b - n
    ids.copy_(torch.tensor(id_list + [0] * pad, dtype=torch.int32))
    pos.copy_(torch.tensor(pos_list + [0] * pad, dtype=torch.int32))
    pages.copy_(torch.tensor(page_list + [scratch] * pad, dtype=torch.int32))
    lens.copy_(pos + 1)
    table[n:, 0] = scratch
    return 4 * b + b * width


def measure(batch: int, page: int, context: int, steps: int = 200) -> dict:
    width = context // page + 1
    rows = [list(range(i * width, (i + 1) * width)) for i in range(batch)]
    start = context - steps - 1 - page  # the rows are near the end of the context: long page lists

    def chunks(step):
        return [Chunk(r, start + step, [7]) for r in rows]

    st = DecodeStaging(batch, width, page, batch * width)
    control_buf = torch.zeros(4 * batch + batch * width, dtype=torch.int32)
    ours, control, sent, control_sent = [], [], [], 0
    for step in range(steps):
        c = chunks(step)
        t0 = time.perf_counter()
        n, _ = st.stage(c, batch)
        t1 = time.perf_counter()
        control_sent = control_stage(control_buf, c, batch, width, page, batch * width)
        t2 = time.perf_counter()
        if step:  # the first step sends the whole table: the steady state is what repeats
            ours.append(t1 - t0)
            control.append(t2 - t1)
            sent.append(n * 4)
    return {"batch": batch, "page": page, "context": context, "ours_ms": statistics.median(ours) * 1e3,
            "control_ms": statistics.median(control) * 1e3, "ours_bytes": statistics.mean(sent),
            "control_bytes": control_sent * 4}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    res = [measure(*s) for s in SHAPES]
    print(f"{'batch':>6} {'page':>5} {'context':>8} {'ours ms':>8} {'control ms':>11} {'ours B/step':>12} "
          f"{'control B/step':>15}")
    for r in res:
        print(f"{r['batch']:>6} {r['page']:>5} {r['context']:>8} {r['ours_ms']:>8.3f} {r['control_ms']:>11.3f} "
              f"{r['ours_bytes']:>12.0f} {r['control_bytes']:>15}")
    if args.json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
