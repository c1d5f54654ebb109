"""What both workers need to put their spans on a request (names.py, "the workers' spans"): whether a
request is traced at all, times measured with time.monotonic() as span times, a store op's completion
as a span, and a store answer as a miss reason.

Every function here is a no-op for a request that is not traced (tracing off, no `trace_ctx`, or its
trace not sampled): callers call them unconditionally, and no attribute is built then.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterable, Mapping, Sequence

from opentelemetry import trace
from opentelemetry.context import Context

from pdorch.tracing import names
from pdorch.tracing.process import process_tracing
from pdorch.tracing.spans import AttributeValue, link_to, now_ns, record_span
from store_client import results

# The store's answer for a page (store_client/results.py) -> the miss reason a trace shows.
_STORE_MISS = {results.ABSENT: names.MISS_NOT_IN_STORE, results.DISABLED: names.MISS_STORE_UNAVAILABLE,
               results.RPC_FAILED: names.MISS_STORE_UNAVAILABLE, results.TIMEOUT: names.MISS_STORE_UNAVAILABLE,
               results.TRANSFER_FAILED: names.MISS_TRANSFER_FAILED,
               results.SIZE_MISMATCH: names.MISS_LAYOUT_MISMATCH}


def traced(ctx: Context | None) -> bool:
    """Whether spans under `ctx` are kept: tracing on and the request's trace sampled."""
    if ctx is None or not process_tracing().enabled:
        return False
    return trace.get_current_span(ctx).get_span_context().trace_flags.sampled


def ns_at(monotonic_s: float) -> int:
    """A time.monotonic() value as span time (unix ns)."""
    return now_ns() - int((time.monotonic() - monotonic_s) * 1e9)


def request_span(ctx: Context | None, request_id: str) -> None:
    """Name the request on the worker's RPC span (the ring finds the trace by pdorch.request_id)."""
    if traced(ctx):
        trace.get_current_span(ctx).set_attribute(names.REQUEST_ID, request_id)


def record(name: str, ctx: Context | None, start_ns: int, attributes: Mapping[str, AttributeValue],
           end_ns: int | None = None, error: str = "") -> None:
    """A finished interval under the request's span (ends now unless `end_ns`); no-op when not traced."""
    if traced(ctx):
        record_span(process_tracing(), name, ctx, start_ns, now_ns() if end_ns is None else end_ns, attributes,
                    error)


def add_event(ctx: Context | None, name: str, attributes: Mapping[str, AttributeValue]) -> None:
    """An event on the request's RPC span (decode.generate / prefill.prefill)."""
    if traced(ctx):
        trace.get_current_span(ctx).add_event(name, attributes)


def store_miss(reason: str) -> str:
    """The miss reason of a page the store did not give (`reason`: a store_client.results reason)."""
    return _STORE_MISS.get(reason, names.MISS_STORE_UNAVAILABLE)


def page_misses(done, n: int) -> list[str]:
    """Per page a store load (IOCompletion) did not give, in order, its miss reason; `n` pages asked."""
    ok = list(done.page_ok) + [False] * (n - len(done.page_ok))
    missed = ok.count(False)
    per_page = list(done.miss_reasons) if len(done.miss_reasons) == missed else [done.reason] * missed
    return [store_miss(r) for r in per_page]


def pages_by_reason(reasons: Iterable[str]) -> dict[str, int]:
    """{pdorch.pages.<reason>: pages} for the miss reasons given (one per page)."""
    return {f"{names.PAGES}.{r}": n for r, n in collections.Counter(reasons).items()}


def record_store_read(name: str, ctx: Context | None, done, page_nbytes: int, num_keys: int,
                      misses: Sequence[str] | None = None) -> None:
    """A store load (its IOCompletion, submit -> completion) as a span: keys, pages by tier, bytes, and
    the pages it did not give by miss reason (`misses`, one per such page; default page_misses())."""
    if not traced(ctx):
        return
    end = now_ns()
    ssd = sum(1 for good, disk in zip(done.page_ok, done.page_ssd) if good and disk)
    attrs: dict[str, AttributeValue] = {
        names.KEYS: num_keys, f"{names.PAGES}.store": done.pages_ok - ssd, f"{names.PAGES}.ssd": ssd,
        names.BYTES: done.pages_ok * page_nbytes, names.STORE_RESULT: done.reason}
    attrs.update(pages_by_reason(page_misses(done, num_keys) if misses is None else misses))
    record_span(process_tracing(), name, ctx, end - int(done.elapsed_s * 1e9), end, attrs,
                "" if done.reason == results.OK or done.pages_ok else f"store read failed: {done.reason}")


def record_store_write(name: str, ctxs: Sequence[Context | None], request_ids: Sequence[str], done,
                       page_nbytes: int, kinds: Sequence[str]) -> None:
    """A store write (its IOCompletion) as a span of its own, LINKED to the traced requests whose pages
    it wrote (no span when none of them is traced)."""
    linked = [c for c in ctxs if traced(c)]
    if not linked:
        return
    links = [link for c in linked for link in link_to(c)]
    end = now_ns()
    attrs: dict[str, AttributeValue] = {
        names.PAGES_WRITTEN: done.pages_ok, names.PAGES_FAILED: done.num_pages - done.pages_ok,
        names.BYTES: done.pages_ok * page_nbytes, names.STORE_RESULT: done.reason,
        names.WRITE_KIND: ",".join(sorted(set(kinds))), names.LINKED_REQUESTS: list(request_ids)}
    tracing = process_tracing()
    span = tracing.tracer.start_span(name, context=None, attributes=attrs, links=links,
                                     start_time=end - int(done.elapsed_s * 1e9))
    if done.reason != results.OK:
        span.set_status(trace.Status(trace.StatusCode.ERROR, f"store write: {done.reason}"))
    span.end(end_time=end)

