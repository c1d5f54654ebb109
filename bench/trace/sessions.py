"""Sessions of a trace that records none (Mooncake's format without aiperf's `session_id`), from the
prompts' blocks, so that --sessions-fraction keeps whole conversations and their reuse.

Mooncake's hash ids are prefix hashes: an id stands for its whole prefix, so the blocks of all
requests form a tree. A block after which more than two different blocks follow somewhere in the
trace is a fork shared by several conversations (a system prompt); inside one conversation a block is
followed by at most two (a turn's partial last block, and the same block completed by the next turn).
A request's session is the first block after the last such fork on its path:

    turn 1   [0, a1, a2, a3]              0 is followed by a1, c1, d1, ... (a fork)  -> session a1
    turn 2   [0, a1, a2, a3', b1, b2]     same path below the fork                  -> session a1
    other    [0, c1, c2]                                                            -> session c1

A request whose every block sits at or above a fork, or one without blocks, is a session of its own.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from itertools import pairwise

from bench.trace.request import TraceRequest

FORK_SUCCESSORS = 2  # a block followed by more than this many different blocks is a fork


def session_of(blocks: tuple[int, ...], successors: dict[int, set[int]], index: int) -> str:
    last_fork = -1
    for i, block in enumerate(blocks):
        if len(successors.get(block, ())) > FORK_SUCCESSORS:
            last_fork = i
    if not blocks or last_fork == len(blocks) - 1:
        return f"request-{index}"
    return f"block-{blocks[last_fork + 1]}"


def infer_sessions(requests: list[TraceRequest], keep: list[bool]) -> list[TraceRequest]:
    """`requests` with the inferred session, except where `keep[i]` (the record named its own)."""
    successors: dict[int, set[int]] = defaultdict(set)
    for r in requests:
        for a, b in pairwise(r.blocks):
            successors[a].add(b)
    return [r if kept else dataclasses.replace(r, session=session_of(r.blocks, successors, r.index))
            for r, kept in zip(requests, keep)]
