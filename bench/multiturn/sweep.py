"""`pdorch bench multiturn --sweep`: the multi-turn load over a grid of cache shapes, each on a cluster
of its own, and per shape the worst hit rate over the free-L1 capacity-bound ideal (rounds >= 1).

A shape: clients, turn tokens (the first turn as long, answers a quarter of a turn unless given), the
prefill worker's L1 as a multiple of the run's longest prompt, the store as a fraction of the final
working set (two segments: the prefill and the decode worker's), and the requests in flight (the
decode pool is sized for those, as every preset sizes it). Per round (bench/multiturn/stats.py):

    capacity(r)          = store pages at the master's watermark + (L1 - the longest prompt of round r)
    free-L1 ideal(r)     = page-aligned ideal(r) x min(1, capacity(r) / pages of the previous contexts)

NOTE: the decode worker's own prefix cache is not counted as capacity: its pool is sized for the
requests in flight, and between two turns it holds what those requests left. Shapes with fewer
requests in flight than clients make it too small for the conversations, so the prefill worker's
L1 and the store have to hold them.
"""

from __future__ import annotations

import dataclasses
import math

from bench.multiturn.presets import MIB, Workload, final_working_set_pages, page_bytes
from pdorch.config import Config


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    clients: int
    turn_tokens: int
    l1_prompts: int  # prefill L1 = this many of the run's longest prompts
    store_fraction: float  # the store (2 segments) = this fraction of the final working set
    max_parallel: int = 0  # requests in flight (0 = clients)
    first_tokens: int = 0  # 0 = turn_tokens
    output_tokens: int = 0  # 0 = turn_tokens // 4
    l1_pages: int = 0  # explicit L1 (overrides l1_prompts)
    segment_mb: int = 0  # explicit segment size (overrides store_fraction)

    def workload(self, rounds: int, api: str) -> Workload:
        return Workload(self.clients, rounds, self.first_tokens or self.turn_tokens, self.turn_tokens,
                        self.output_tokens or self.turn_tokens // 4, api, self.max_parallel)


SHAPES = (
    Shape("c4-t64-l1x1-s0.3", 4, 64, 1, 0.3),
    Shape("c4-t128-l1x3-s0.5", 4, 128, 3, 0.5),
    Shape("c4-t256-l1x4-s0.9", 4, 256, 4, 0.9),
    Shape("c8-t64-l1x2-s0.5", 8, 64, 2, 0.5),
    Shape("c8-t64-l1x4-s0.8", 8, 64, 4, 0.8),
    Shape("c8-t128-l1x1-s0.7", 8, 128, 1, 0.7),
    Shape("c8-t256-l1x2-s0.3", 8, 256, 2, 0.3),
    Shape("c8-t256-l1x3-s0.6", 8, 256, 3, 0.6),
    Shape("c16-t64-l1x4-s0.3", 16, 64, 4, 0.3),
    Shape("c16-t128-l1x2-s0.5", 16, 128, 2, 0.5),
    Shape("c16-t128-l1x1-s0.9", 16, 128, 1, 0.9),
    Shape("c16-t256-l1x1-s0.4", 16, 256, 1, 0.4),
    # Fewer requests in flight than conversations: the decode pool holds only what they leave.
    Shape("c16-t128-l1x2-s0.5-par4", 16, 128, 2, 0.5, max_parallel=4),
    Shape("c8-t256-l1x2-s0.4-par2", 8, 256, 2, 0.4, max_parallel=2),
    # The shape of the issue that asked for this sweep: 256-token first turns growing by 160 tokens
    # (112 + a 48-token answer) a round, a 192-page L1, 2 x 160 MiB segments.
    Shape("issue-c8-f256-t112-o48", 8, 112, 0, 0.0, first_tokens=256, output_tokens=48, l1_pages=192,
          segment_mb=160),
)


def shape_overrides(shape: Shape, w: Workload, cfg: Config, kv_values_per_token: int) -> list[str]:
    """The --set flags of one shape (before the user's own, which win)."""
    P = cfg.model.page_size
    last = w.rounds - 1
    longest = math.ceil(w.prompt_tokens(last) / P)
    l1 = shape.l1_pages or shape.l1_prompts * longest
    final = final_working_set_pages(w, P)
    segment_mb = shape.segment_mb or max(16, math.ceil(shape.store_fraction * final * page_bytes(cfg, kv_values_per_token)
                                                       / 2 / MIB))
    in_flight = min(w.clients, w.max_parallel or w.clients)
    decode_pages = math.ceil(in_flight * math.ceil((w.prompt_tokens(last) + w.output_tokens + 1) / P)
                             / cfg.decode.kv_watermark) + 16
    return [f"prefill.num_pages={l1}", f"store.global_segment_size_mb={segment_mb}",
            f"decode.num_pages={decode_pages}", "decode.prefill_timeout_s=600"]


def pick(names: str | None) -> list[Shape]:
    """The shapes named in a comma-separated list (all when None); unknown names raise ValueError."""
    if not names:
        return list(SHAPES)
    by_name = {s.name: s for s in SHAPES}
    wanted = [n for n in names.split(",") if n]
    unknown = [n for n in wanted if n not in by_name]
    if unknown:
        raise ValueError(f"unknown shape(s) {', '.join(unknown)}; choose from {', '.join(by_name)}")
    return [by_name[n] for n in wanted]


def shape_row(shape: Shape, w: Workload, res: dict) -> dict:
    """What the sweep keeps of one shape's run."""
    return {"shape": shape.name, "clients": w.clients, "turn_tokens": w.turn_tokens, "first_tokens": w.first_tokens,
            "output_tokens": w.output_tokens, "max_parallel": w.max_parallel or w.clients, "l1_pages": res["l1_pages"],
            "store_capacity_mib": round(res["store_capacity_bytes"] / MIB, 1),
            "worst_hit_over_free_l1_capacity_ideal": res["worst_hit_over_free_l1_capacity_ideal"],
            "worst_hit_over_ideal": res["worst_hit_over_ideal"], "failed_requests": res["failed_requests"],
            "store_pages_evicted": res["store_pages_evicted"],
            "store_pages_evicted_by_pdorch": res["store_pages_evicted_by_pdorch"],
            "rounds": [{k: r[k] for k in ("round", "hit_rate", "ideal_hit_rate", "free_l1_capacity_ideal_hit_rate",
                                          "ttft_mean_s", "reads")} for r in res["rounds"]]}


def sweep_table(rows: list[dict]) -> str:
    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    lines = [("shape                        L1 pages  store MiB  worst hit/free-L1 cap-ideal  worst hit/ideal  "
             "evicted master/pdorch  hit (free-L1 cap-ideal) by round")]
    for row in rows:
        by_round = " ".join(f"{f(r['hit_rate'], '.2f')}({f(r['free_l1_capacity_ideal_hit_rate'], '.2f')})"
                            for r in row["rounds"][1:])
        lines.append(f"{row['shape']:<28} {row['l1_pages']:>8} {row['store_capacity_mib']:>10} "
                     f"{f(row['worst_hit_over_free_l1_capacity_ideal'], '.3f'):>28} "
                     f"{f(row['worst_hit_over_ideal'], '.3f'):>16} "
                     f"{f(row['store_pages_evicted'], '.0f'):>14}/{f(row['store_pages_evicted_by_pdorch'], '.0f'):<7} "
                     f"{by_round}")
    return "\n".join(lines)
