"""The decode worker's spans of one request (docs/operations.md, "Worker spans"), children of its
decode.generate RPC span (`req.trace_ctx`):

    decode.admission     pages for the prompt: D's prefix-cache hits (device, inflight), the wait for pages
    decode.prefix_match  the prompt plan: where each page comes from (pdorch.plan = where:reason),
                         pages D holds, reads from the store itself, computes, or leaves to P
    decode.store_read    D's own store read (submit -> completion): keys, pages, bytes, and per page
                         that did not come why (absent at the read, present at the check: evicted)
    decode.first_token   the Generate call's arrival -> its first token (P's, or D's own after a local plan)
    decode.stream        first token -> the stream's end: finish reason, tokens, preemptions; an error
                         ends it ERROR
    decode.preempted     preempted -> resumed (and an event of that name on decode.generate when preempted)
    decode.store_write   one decode step's store write (offload, write-back of pages computed here): a
                         span of its own, LINKED to the requests whose pages it wrote

No-ops for a request that is not traced (pdorch/tracing/worker_spans.py): callers call them
unconditionally. The handler thread records the first five; the scheduler thread the others.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from decode_node.messages import PageWrite
from decode_node.prompt_plan import PromptPlan, Source
from decode_node.request import DecodeEvent, DecodeRequest
from pdorch.tracing import names
from pdorch.tracing import worker_spans as ws
from pdorch.tracing.spans import AttributeValue
from pdorch.worker.prompt_pages import reusable_pages

if TYPE_CHECKING:
    from opentelemetry.context import Context

    from store_client.io_thread import IOCompletion

PAGES = names.PAGES


@contextlib.contextmanager
def admission(req: DecodeRequest) -> Iterator[None]:
    """Around the request's admission (decode.admission; ERROR when it failed)."""
    if not ws.traced(req.trace_ctx):
        yield
        return
    start, t0 = ws.now_ns(), time.monotonic()
    error = ""
    try:
        yield
    except BaseException as e:
        error = f"admission failed: {e}"
        raise
    finally:
        ws.record(names.DECODE_ADMISSION, req.trace_ctx, start,
                  {names.REQUEST_ID: req.request_id, f"{PAGES}.device": len(req.l1_pages) - req.inflight_pages,
                   f"{PAGES}.inflight": req.inflight_pages, names.QUEUE_S: time.monotonic() - t0}, error=error)


def planned(req: DecodeRequest, plan: PromptPlan, start_ns: int, page_size: int, store_reason: str) -> None:
    """The prompt plan was made (decode.prefix_match, from `start_ns`: the existence check included).
    `store_reason`: why a page D computes itself was not read (not_in_store; store_unavailable when
    the check could not run)."""
    if not ws.traced(req.trace_ctx):
        return
    sources = plan.sources(reusable_pages(req.prompt_len, page_size))
    attrs: dict[str, AttributeValue] = {
        names.PLAN: f"{plan.where}:{plan.reason}", f"{PAGES}.device": len(plan.held) - req.inflight_pages,
        f"{PAGES}.inflight": req.inflight_pages, f"{PAGES}.store": len(plan.load),
        f"{PAGES}.prefill": sources.count(Source.PREFILL)}
    here = sources.count(Source.HERE)
    if here:
        attrs[f"{PAGES}.{store_reason}"] = here
    ws.record(names.DECODE_PREFIX, req.trace_ctx, start_ns, attrs)


def store_read(trace_ctx: Context | None, num_pages: int, done: IOCompletion, page_nbytes: int) -> None:
    """D's own store read of `num_pages` pages completed (scheduler thread). Its pages were present at
    the existence check a moment before, so a page absent now was evicted meanwhile."""
    if not ws.traced(trace_ctx):
        return
    misses = tuple(names.MISS_EVICTED if m == names.MISS_NOT_IN_STORE else m
                   for m in ws.page_misses(done, num_pages))
    ws.record_store_read(names.DECODE_STORE_READ, trace_ctx, done, page_nbytes, num_pages, misses=misses)


def streamed(req: DecodeRequest, events: Iterator[DecodeEvent]) -> Iterator[DecodeEvent]:
    """The request's events, passed on; records decode.first_token at the first event carrying tokens
    and decode.stream when the stream ends (however it ends)."""
    if not ws.traced(req.trace_ctx):
        yield from events
        return
    first_ns, finish, error = 0, "", ""
    try:
        for event in events:
            if not first_ns and event.token_ids:
                first_ns = ws.now_ns()
                ws.record(names.DECODE_FIRST_TOKEN, req.trace_ctx, req.arrived_ns, {names.REQUEST_ID: req.request_id},
                          end_ns=first_ns)
            if event.error is not None:
                error = f"{type(event.error).__name__}: {event.error}"
            elif event.finish_reason and event.index == 0:
                finish = event.finish_reason
            yield event
    except GeneratorExit:  # the consumer went away: not an error of the request's
        raise
    except BaseException as e:
        error = error or f"{type(e).__name__}: {e}"
        raise
    finally:
        if not finish and not error:
            finish = "cancelled"  # the consumer went away (the router's client, an Abort)
        ws.record(names.DECODE_STREAM, req.trace_ctx, first_ns or req.arrived_ns,
                  {names.FINISH_REASON: finish or "error", names.TOKENS: sum(s.num_generated for s in req.sequences),
                   names.PREEMPTIONS: req.preempt.count}, error=error)


def preempted(req: DecodeRequest) -> None:
    ws.add_event(req.trace_ctx, names.DECODE_PREEMPTED, {names.TOKENS: req.num_generated,
                                                          names.PREEMPTIONS: req.preempt.count})


def resumed(req: DecodeRequest, paused_since: float) -> None:
    ws.record(names.DECODE_PREEMPTED, req.trace_ctx, ws.ns_at(paused_since),
              {names.REQUEST_ID: req.request_id, names.PREEMPTIONS: req.preempt.count})


def step_written(owners: Sequence[DecodeRequest], writes: Sequence[PageWrite], done: IOCompletion,
                 page_nbytes: int) -> None:
    """A step's store write completed: one span linked to each traced request among its owners."""
    traced = [r for r in owners if ws.traced(r.trace_ctx)]
    if traced:
        ws.record_store_write(names.DECODE_STORE_WRITE, [r.trace_ctx for r in traced],
                              [r.request_id for r in traced], done, page_nbytes, [w.kind for w in writes])
