"""The prefill worker's spans of one task (docs/operations.md, "Worker spans"), children of its
prefill.prefill RPC span (`task.trace_ctx`):

    prefill.queue         Prefill arrived -> its pages allocated (task.created -> task.admitted)
    prefill.prefix_match  pages allocated -> every reusable page in place or known missing:
                          pdorch.pages.<tier> and pdorch.pages.<miss reason> (task.prefix)
    prefill.store_read    its one store load (submit -> completion): keys, pages, bytes, misses
    prefill.decode_read   the read of prefix pages from D's pool
    prefill.compute       its first forward -> its first token (pdorch.chunks forwards)
    prefill.kv_push       the transfer into D's pages: bytes, transport
    prefill.store_write   its write-back: a span of its own, LINKED to the task's

Every function is a no-op for a task that is not traced (pdorch/tracing/worker_spans.py), so the
scheduler calls them unconditionally. Called on the scheduler thread, but `pushed` and `decode_read`
(pusher threads).
"""

from __future__ import annotations

from pdorch.tracing import names
from pdorch.tracing import worker_spans as ws
from prefill_node.task import PrefillTask

PAGES = names.PAGES


def queued(task: PrefillTask) -> None:
    ws.record(names.PREFILL_QUEUE, task.trace_ctx, ws.ns_at(task.created), {names.REQUEST_ID: task.request_id},
              end_ns=ws.ns_at(task.admitted))


def prefix_matched(task: PrefillTask) -> None:
    """Admission settled every reusable page (prefix.py's plan): where each came from, why the others are computed."""
    if not ws.traced(task.trace_ctx):
        return
    p = task.prefix
    attrs = {f"{PAGES}.device": p.device_pages + p.decode_pages, f"{PAGES}.decode_pool": p.decode_pages,
             f"{PAGES}.inflight": p.inflight_pages, f"{PAGES}.store": p.store_pages, f"{PAGES}.ssd": p.ssd_pages,
             names.PAGES_HOLES: len(p.holes)}
    attrs.update(ws.pages_by_reason(p.miss_reasons.get(i, names.MISS_NOT_IN_STORE) for i in p.holes))
    ws.record(names.PREFILL_PREFIX, task.trace_ctx, ws.ns_at(task.admitted), attrs)


def store_read(task: PrefillTask, done, page_nbytes: int) -> None:
    ws.record_store_read(names.PREFILL_STORE_READ, task.trace_ctx, done, page_nbytes, done.num_pages)


def decode_read(task: PrefillTask, err: Exception | None, nbytes: int, seconds: float, pages: int) -> None:
    if ws.traced(task.trace_ctx):
        end = ws.now_ns()
        ws.record(names.PREFILL_DECODE_READ, task.trace_ctx, end - int(seconds * 1e9),
                  {f"{PAGES}.decode_pool": pages, names.BYTES: nbytes}, end_ns=end,
                  error=f"read from the decode worker failed: {err}" if err is not None else "")


def computed(task: PrefillTask, page_size: int) -> None:
    c = task.compute
    if ws.traced(task.trace_ctx) and c.chunks:
        ws.record(names.PREFILL_COMPUTE, task.trace_ctx, ws.ns_at(c.started),
                  {names.CHUNKS: c.chunks, names.TOKENS: task.computed_tokens(page_size)})


def pushed(task: PrefillTask, err: Exception | None, nbytes: int, seconds: float, transport: str) -> None:
    if ws.traced(task.trace_ctx):
        end = ws.now_ns()
        ws.record(names.PREFILL_PUSH, task.trace_ctx, end - int(seconds * 1e9),
                  {names.BYTES: nbytes, names.TRANSPORT: transport, names.DECODE_WORKER: task.job.decode_segment},
                  end_ns=end, error=f"KV push failed: {err}" if err is not None else "")


def written(task: PrefillTask, done, page_nbytes: int) -> None:
    ws.record_store_write(names.PREFILL_STORE_WRITE, [task.trace_ctx], [task.request_id], done, page_nbytes,
                          ["writeback"])
