"""n > 1 on the decode worker: one prefill, one KV push, n sequences sharing the prompt's pages.

    admit   pages_for(prompt + 1) for sequence 0, plus one spare page per further sequence
    P       computes the prompt once, pushes it once, samples every sequence's first token from the
            same logits (sequence i: generator seed + i, a fork of the grammar; PrefillResponse
            more_first)
    fork    (handler thread) sequences 1 .. n-1 as DecodeRequests of their own: first token, stop
            checker, generator state from P, grammar forked before sequence 0's first token
    place   (scheduler thread, a Fork message before sequence 0 joins) each fork retains the
            prompt's full pages and gets its spare page, a copy of the page holding the prompt's
            end and the first decode position: copy-on-write of the one page they would share
            and write into. Then it joins the batch as a request of its own.

The forks share sequence 0's events queue (each event carries its `index`) and its deadline; the
handler streams until every sequence has ended, and a cancel of the request cancels them all.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from decode_node.request import DecodeRequest
from decode_node.stopping import check_stop, make_stopper


@dataclass(frozen=True)
class Fork:
    """Place a fork (scheduler thread): retain `shared`, copy page `tail` into `spare` (one of
    sequence 0's spare pages, handed over with the message)."""

    req: DecodeRequest
    shared: tuple[int, ...]
    tail: int
    spare: int


def shared_pages(prompt_len: int, page_size: int) -> int:
    """The prompt's full pages: what every sequence reads and none writes (the page after them
    holds the first decode position, so each sequence has its own)."""
    return prompt_len // page_size


def fork_sequences(req: DecodeRequest, more_first, tokenizer, max_context: int, continue_generator) -> list:
    """Sequences 1 .. n-1 of `req` from P's first tokens: [(fork, its first event)]. Call before
    sequence 0's grammar accepts its own first token (the forks start from the state before it)."""
    out = []
    for i, first in enumerate(more_first, 1):
        params = req.job.params.sequence(i)
        job = replace(req.job, request_id=f"{req.request_id}#{i}", params=params)
        fork = DecodeRequest(job=job, deadline=req.deadline, own_deadline=req.own_deadline,
                             stopper=make_stopper(tokenizer, params, list(job.token_ids)),
                             token_ids=list(job.token_ids), page_hashes=list(req.page_hashes),
                             generator=continue_generator(params, first.sampler_state),
                             grammar=None if req.grammar is None else req.grammar.fork(),
                             index=i, events=req.events)
        if fork.grammar is not None:
            fork.grammar.accept(first.token_id)
        fork.token_ids.append(first.token_id)
        out.append((fork, replace(check_stop(fork, first.token_id, max_context, first.logprob), index=i)))
    return out


def place(fork: Fork, allocator, runner) -> list[int]:
    """Scheduler thread: the fork's pages (shared ones retained, its spare filled from the tail, on
    every TP rank); the scheduler gives them to the fork."""
    allocator.retain(fork.shared)
    runner.copy_page(fork.tail, fork.spare)
    return [*fork.shared, fork.spare]
