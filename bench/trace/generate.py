"""Synthetic traces in Mooncake's format (bench/trace/mooncake.py), deterministic with --seed:

    python -m bench.trace.generate OUT.jsonl [parameters]     (= pdorch bench trace generate ...)

Sizes are in hash blocks (each recorded as --block-size tokens, 512 like the FAST'25 traces; the
replay's --block-tokens says how many tokens a block becomes). Every record carries aiperf's
`session_id`, so --sessions-fraction keeps whole conversations and whole fan-out groups.

Multi-turn sessions (--sessions N): session i uses system prompt i mod --system-prompts
(--system-blocks blocks, shared by every session that uses it); turn 0 adds --first-blocks blocks;
turn t carries turn t-1's prompt, --answer-blocks blocks of its answer and --turn-blocks new ones
(a recorded trace hashes the answer into the next prompt). Sessions start --session-interval-s apart
on average (exponential gaps), a session's turns --think-time-s apart (uniform 0.5x to 1.5x).

Fan-out (--fanout-groups G): each group is --fanout-width requests sharing one prefix (a system
prompt and --fanout-prefix-blocks blocks of their own: an agent's context) with --fanout-suffix-blocks
blocks each (a tool call, a sub-agent's task), sent evenly over --fanout-window-s: a window shorter
than the prefix's prefill makes them overlap in prefill (what in-flight sharing is for), a window
longer than it spaces them out (the same trace, replayed at the ideal). Groups start
--fanout-interval-s apart.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import asdict, dataclass, fields
from pathlib import Path


@dataclass(frozen=True)
class GenerateParams:
    seed: int = 0
    block_size: int = 512
    sessions: int = 0
    turns: int = 3
    system_prompts: int = 1
    system_blocks: int = 4
    first_blocks: int = 8
    turn_blocks: int = 4
    answer_blocks: int = 2
    output_tokens: int = 32
    session_interval_s: float = 4.0
    think_time_s: float = 8.0
    fanout_groups: int = 0
    fanout_width: int = 8
    fanout_prefix_blocks: int = 64
    fanout_suffix_blocks: int = 2
    fanout_window_s: float = 1.0
    fanout_interval_s: float = 10.0
    fanout_start_s: float = 0.0
    fanout_output_tokens: int = 16


class _Ids:
    def __init__(self):
        self.next = 0

    def take(self, n: int) -> list[int]:
        self.next += n
        return list(range(self.next - n, self.next))


def generate(p: GenerateParams) -> list[dict]:
    """The records, sorted by timestamp (creation order among equal ones)."""
    rng, ids = random.Random(f"pdorch-trace-generate:{p.seed}"), _Ids()
    systems = [ids.take(p.system_blocks) for _ in range(max(1, p.system_prompts))]
    made: list[tuple[float, dict]] = []

    def record(t: float, blocks: list[int], output: int, session: str) -> None:
        made.append((t, {"timestamp": round(t * 1000), "input_length": len(blocks) * p.block_size,
                         "output_length": output, "hash_ids": blocks, "session_id": session}))

    start = 0.0
    for s in range(p.sessions):
        if s:
            start += rng.expovariate(1.0 / p.session_interval_s) if p.session_interval_s > 0 else 0.0
        t, blocks = start, systems[s % len(systems)] + ids.take(p.first_blocks)
        for turn in range(p.turns):
            if turn:
                t += p.think_time_s * rng.uniform(0.5, 1.5)
                blocks = blocks + ids.take(p.answer_blocks) + ids.take(p.turn_blocks)
            record(t, blocks, p.output_tokens, f"session-{s}")
    for g in range(p.fanout_groups):
        prefix = systems[g % len(systems)] + ids.take(p.fanout_prefix_blocks)
        t0 = p.fanout_start_s + g * p.fanout_interval_s
        for m in range(p.fanout_width):
            at = t0 + m * p.fanout_window_s / p.fanout_width
            record(at, prefix + ids.take(p.fanout_suffix_blocks), p.fanout_output_tokens, f"fanout-{g}")
    made.sort(key=lambda x: x[0])  # NOTE: stable: equal times keep creation order
    return [r for _, r in made]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pdorch bench trace generate", allow_abbrev=False,
                                description="Write a synthetic trace in Mooncake's format (bench/trace/generate.py).")
    p.add_argument("out", help="the JSONL file to write")
    for f in fields(GenerateParams):
        p.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default,
                       help=f"(default {f.default})")
    return p


def main(argv: list[str] | None = None) -> int:
    args = vars(parser().parse_args(argv))
    out = Path(args.pop("out"))
    params = GenerateParams(**args)
    for name, value in asdict(params).items():
        least = 1 if name in ("block_size", "turns", "fanout_width", "system_prompts") else 0
        if name != "seed" and value < least:
            parser().error(f"--{name.replace('_', '-')} must be >= {least}, got {value}")
    records = generate(params)
    out.write_text("".join(json.dumps(r) + "\n" for r in records))
    span = records[-1]["timestamp"] / 1000 if records else 0.0
    print(f"{out}: {len(records)} requests over {span:.1f} s, {len({r['session_id'] for r in records})} sessions",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
