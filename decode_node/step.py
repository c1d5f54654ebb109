"""DecodeStep: one forward of the decode batch, on the scheduler thread (decode_node/scheduler.py
runs it once per iteration, after every running request got the page its next position needs).

    chunks   per running request a 1-token chunk at its newest position, or chunks of the prompt
             it computes here (decode_node/step_batch.py); requests that got no page sit out
    forward  ONE forward of all of them
    sample   the rows that draw a token: decode rows, and local prefills whose prompt is done
    writes   pages that filled (the prompt's, computed here; generated ones) go to the prefix cache
             and into this step's ONE store write, handed to decode_node/step_writes.py once
    stop     the stop checks; a final event finishes the request (the scheduler's `finish`), the
             others stream their tokens (after the write: a request finishing now keeps the pages
             it reads)
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from prometheus_client import Counter

from decode_node.admission import Admission
from decode_node.growth import GrowthReserve
from decode_node.offload import extend_hash_chain, filled_page
from decode_node.preemption import Preemption
from decode_node.prefix_cache import DecodePrefixCache
from decode_node.request import DecodeEvent, DecodeRequest
from decode_node.step_batch import draw_tokens, step_chunks
from decode_node.step_writes import StepWrites
from decode_node.stopping import check_stop
from pdorch.worker.prompt_pages import consume


class DecodeStep:
    def __init__(self, rt, recorder, writes: StepWrites, cache: DecodePrefixCache, admission: Admission,
                 preemption: Preemption, reserve: GrowthReserve | None, offload: bool, local_prefill_tokens: int,
                 finish: Callable[[DecodeRequest, DecodeEvent], None]):
        """`offload`: generated pages go to the store as they fill; `finish(req, final event)`: the
        scheduler takes an ended request out of the batch."""
        self._rt, self._rec, self._writes, self.cache = rt, recorder, writes, cache
        self._admission, self._preemption, self._reserve = admission, preemption, reserve
        self._offload, self._finish = offload, finish
        self._page_size, self._max_context = rt.page_size, rt.max_context
        # prompt tokens computed here per step (local prefill, pages D could not read); at least a page
        self._local_budget = max(local_prefill_tokens, rt.page_size)
        self._local_tokens = Counter("pdorch_decode_local_prefill_tokens", "Prompt tokens this decode worker "
                                     "computed itself (conditional disaggregation, pages it could not read)",
                                     registry=recorder.registry)

    def run(self, running: list[DecodeRequest], stalled: set[DecodeRequest]) -> bool:
        """One step of `running` but the `stalled` requests; False when there was nothing to feed."""
        rows, chunks = step_chunks(running, stalled, self._page_size, self._local_budget)
        if not chunks:
            return False
        with torch.inference_mode():
            logits = self._rt.runner.forward(chunks)
        sample = []  # rows whose next token is drawn now: decode steps and finished local prefills
        filled: list[tuple[DecodeRequest, int, str]] = []  # this step's store write: (request, page, kind)
        for row, (req, end) in enumerate(rows):
            if end < 0:
                sample.append(row)
                continue
            consume(req.compute.todo, end)
            if not req.preempt.resuming:  # a resume's recomputed pages count as such (decode_node/preemption.py)
                self._local_tokens.inc(chunks[row].end - chunks[row].start_pos)
            if not req.compute.todo:
                self._prompt_computed(req, filled)
                if req.compute.first_pending:
                    sample.append(row)
        if self._reserve is not None and len(sample) > 0:
            self._reserve.stepped()
        events = []
        if sample:
            batch = [rows[row][0] for row in sample]
            tokens, logprobs = draw_tokens(self._rt, batch, logits[sample])
            self._rec.generated(len(batch))
            for req, token, lp in zip(batch, tokens, logprobs):
                if req.compute.first_pending:
                    req.compute.first_pending = False  # the prompt's last position was fed, not a new token
                else:
                    self._after_feed(req, len(req.token_ids) - 1, filled)
                req.token_ids.append(int(token))
                events.append((req, check_stop(req, int(token), self._max_context, lp)))
        self._writes.write(filled)  # NOTE: before any request finishes: its pages stay leased to the write
        for req, event in events:
            if event.final:
                self._finish(req, event)
            elif event.token_ids or event.text:
                req.emit(event)
        return True

    def _prompt_computed(self, req: DecodeRequest, filled: list[tuple[DecodeRequest, int, str]]) -> None:
        """Every prompt page is in place: the full pages computed here go to the store (the next turn,
        or another worker, reads them), like a prefill worker's write-back, with or without
        decode.offload_generated_kv (they count as writeback writes, as P's do)."""
        if req.compute.first_pending:
            self._rec.prompt_tokens(computed=req.prompt_len - req.cached.total, cached=req.cached)
        if req.preempt.resuming:  # a preempted request's pages no tier held, recomputed: its KV is whole again
            for k in req.compute.pages:
                self.cache.page_filled(req, k)
            self._preemption.resumed(req, time.monotonic())
        else:
            self._admission.in_place(req)  # to the prefix cache; the requests waiting for its pages take them
        filled += [(req, k, "writeback") for k in req.compute.take_pages()]

    def _after_feed(self, req: DecodeRequest, pos: int, filled: list[tuple[DecodeRequest, int, str]]) -> None:
        """Extend the hash chain when feeding `pos` filled a page, and offload that page."""
        k = filled_page(pos, self._page_size)
        if k is None:
            return
        extend_hash_chain(req.page_hashes, req.token_ids, k, self._page_size)
        self.cache.page_filled(req, k)
        if self._offload:
            filled.append((req, k, "offload"))
        else:
            self.cache.not_written([req.page_ids[k]], "offload_off")
