"""What the replay sends and when: the trace's requests after --sessions-fraction, --speedup,
--output-scale, --duration-s and --max-requests, in the order they are due.

    sessions   a session is kept when a generator seeded by (--seed, session) draws below the
               fraction: whole conversations, the same ones on every run
    time       recorded arrival / speedup, shifted so the first kept request is due at 0; a request
               without a timestamp is due when the previous one of its session ended (+ its delay /
               speedup), the first of a session without either at 0
    order      by estimated due time (delays added up, service time left out), then file position
    cuts       --duration-s drops requests due later; --max-requests keeps the first N; a request
               that follows a dropped one is dropped too (it would carry an answer never made)
    outputs    recorded output length x --output-scale, at least 1 (--default-output-tokens where
               the trace recorded none)
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from bench.trace.request import TraceRequest


@dataclass(frozen=True)
class PlanOptions:
    speedup: float = 1.0
    sessions_fraction: float = 1.0
    seed: int = 0
    output_scale: float = 1.0
    default_output_tokens: int = 32
    duration_s: float | None = None
    max_requests: int | None = None


@dataclass(frozen=True)
class Planned:
    req: TraceRequest
    due_s: float | None     # send at this offset from the run's start (None: when `previous` ended)
    delay_s: float          # after `previous` ended, wait this long first
    previous: int | None    # position in the plan of the request this one waits for
    output_tokens: int
    estimate_s: float       # the estimated due time the order and the cuts use


def keep_session(session: str, fraction: float, seed: int) -> bool:
    return fraction >= 1.0 or random.Random(f"pdorch-trace-session:{seed}:{session}").random() < fraction


def plan(requests: list[TraceRequest], opts: PlanOptions) -> list[Planned]:
    if opts.speedup <= 0:
        raise ValueError(f"--speedup must be > 0, got {opts.speedup}")
    kept = [r for r in requests if keep_session(r.session, opts.sessions_fraction, opts.seed)]
    start = min((r.arrival_s for r in kept if r.arrival_s is not None), default=0.0)
    estimate: dict[int, float] = {}      # request index -> estimated due time
    previous_of: dict[int, int] = {}     # request index -> index of the one it waits for
    last_in_session: dict[str, int] = {}
    for r in sorted(kept, key=lambda r: r.index):
        prev = last_in_session.get(r.session)
        due = None if r.arrival_s is None else (r.arrival_s - start) / opts.speedup
        after = estimate[prev] if prev is not None else 0.0
        if r.follows_previous and prev is not None:
            previous_of[r.index] = prev
            due = max(due if due is not None else 0.0, after + (r.delay_s or 0.0) / opts.speedup)
        estimate[r.index] = due if due is not None else after + (r.delay_s or 0.0) / opts.speedup
        last_in_session[r.session] = r.index
    ordered = sorted(kept, key=lambda r: (estimate[r.index], r.index))
    position: dict[int, int] = {}
    out: list[Planned] = []
    for r in ordered:
        if opts.duration_s is not None and estimate[r.index] > opts.duration_s:
            continue
        if opts.max_requests is not None and len(out) >= opts.max_requests:
            break
        prev = previous_of.get(r.index)
        if prev is not None and prev not in position:
            continue
        outputs = r.output_tokens if r.output_tokens is not None else opts.default_output_tokens
        waits = prev is not None
        if not waits:
            due = estimate[r.index]
        else:
            due = None if r.arrival_s is None else (r.arrival_s - start) / opts.speedup
        out.append(Planned(
            req=r, due_s=due, delay_s=(r.delay_s or 0.0) / opts.speedup if waits else 0.0,
            previous=position[prev] if waits else None,
            output_tokens=max(1, round(outputs * opts.output_scale)), estimate_s=estimate[r.index]))
        position[r.index] = len(out) - 1
    return out
