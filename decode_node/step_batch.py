"""What one decode step feeds the model and draws from it: per running request, a 1-token chunk at
its newest position, or (a prompt D computes itself: conditional disaggregation, pages no tier
held, a resume) chunks of its prompt within the step's token budget; then the next tokens of the
rows that sample."""

from __future__ import annotations

from decode_node.request import DecodeRequest
from engine.model_runner import Chunk
from engine.page_allocator import pages_for
from pdorch.worker.history import token_history
from pdorch.worker.prompt_pages import take_ranges


def step_chunks(running: list[DecodeRequest], stalled: set[DecodeRequest], page_size: int, budget: int
                ) -> tuple[list[tuple[DecodeRequest, int]], list[Chunk]]:
    """(rows, chunks): per chunk, its request and the prompt position it ends at (-1: a decode row,
    sampled this step). `stalled` requests got no page for their next position: they sit out."""
    rows: list[tuple[DecodeRequest, int]] = []
    chunks: list[Chunk] = []
    for req in list(running):
        if req.compute.todo:  # prompt KV computed here first (chunked within the step's budget)
            for start, end in take_ranges(req.compute.todo, budget):
                rows.append((req, end))
                chunks.append(Chunk(page_ids=req.page_ids[:pages_for(end, page_size)], start_pos=start,
                                    token_ids=req.token_ids[start:end]))
                budget -= end - start
            continue
        if req in stalled:
            continue
        pos = len(req.token_ids) - 1  # the newest token is fed now; its K/V lands at `pos`
        rows.append((req, -1))
        chunks.append(Chunk(page_ids=req.page_ids[:pos // page_size + 1], start_pos=pos,
                            token_ids=[req.token_ids[-1]]))
    return rows, chunks


def draw_tokens(rt, batch: list[DecodeRequest], logits) -> tuple[list[int], list]:
    """The next token of each request of `batch` from its row of `logits`, each under its own
    sampling params, generator, grammar and token history (penalties); with their logprobs."""
    params = [r.job.params for r in batch]
    histories = [token_history(rt.eos_token_ids, r.job.params, r.token_ids, r.prompt_len, r.token_counts)
                 for r in batch]
    tokens = rt.sampler.sample(logits, params, [r.generator for r in batch], [r.grammar for r in batch], histories)
    return tokens, rt.sampler.logprobs(logits, tokens, params)
