"""D's own store read of some prompt pages (the plan's STORE pages, decode_node/prompt_plan.py),
on the store I/O thread, while P works or before D computes the rest itself.

The scheduler thread gets the completion (tagged PrefixRead; `read_done`) and hands it to the load's
future unless the handler abandoned the read (cancelled the future): then the scheduler frees the load's
pages itself, once Mooncake is done writing into them. The handler abandons it at its bound, or at
once (within CANCEL_POLL_S) when the request is cancelled (Abort, the caller gone) while it waits.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from opentelemetry.context import Context

from decode_node import spans
from decode_node.request import DecodeRequest
from store_client.page_hash import store_key

LOAD_GRACE_S = 2.0  # D waits this long past its bound for its own store read before abandoning it
CANCEL_POLL_S = 0.02  # how often a handler waiting for the read looks whether its request was cancelled


@dataclass(eq=False)
class PrefixLoad:
    pages: tuple[int, ...]  # indexes into the request's page_ids
    page_ids: tuple[int, ...]
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    from_ssd: tuple[bool, ...] = ()  # per page, once settled: read from the store's SSD tier
    trace_ctx: Context | None = None  # the request's (its decode.store_read span's parent)

    def page_ok(self, done) -> tuple[bool, ...]:
        ok = tuple(done.page_ok)
        self.from_ssd = tuple(done.page_ssd)
        return ok + (False,) * (len(self.pages) - len(ok))

    def settle(self, req: DecodeRequest, op_timeout_s: float,
               cancelled: Callable[[], bool] = lambda: False) -> tuple[bool, ...] | None:
        """The read's page_ok, or None when it was abandoned (past the deadline or store.op_timeout_s,
        whichever comes first, plus a grace; at once when the request is `cancelled()` or its deadline
        passes while it waits): its pages then leave the request (DecodeScheduler.drop_abandoned, before
        any of its pages go back) and the scheduler frees them once Mooncake has stopped writing into them."""
        if self.future.cancelled():  # abandoned before
            return None
        # NOTE: StoreIO completes a load queued past store.op_timeout_s without running it; a running
        # one ends when Mooncake answers, which a stalled store may never do.
        end = time.monotonic() + min(max(0.0, req.deadline - time.monotonic()), op_timeout_s) + LOAD_GRACE_S
        while True:
            try:
                return self.page_ok(self.future.result(timeout=max(0.0, min(CANCEL_POLL_S, end - time.monotonic()))))
            except concurrent.futures.TimeoutError:
                now = time.monotonic()
                if cancelled() or now >= end or now > req.deadline:
                    break
        if not self.future.cancel():  # being answered right now
            return self.page_ok(self.future.result(timeout=LOAD_GRACE_S))
        return None

    @property
    def abandoned(self) -> bool:
        """The handler gave up on the read: its pages are the scheduler's to free when it completes."""
        return self.future.cancelled()


@dataclass(frozen=True, eq=False)
class PrefixRead:
    """The completion tag of a handler's own store read of prompt pages: the scheduler passes
    the completion on to `load.future`, or frees the pages if the handler abandoned the read."""

    load: PrefixLoad


def read_done(rt, done) -> None:
    """Scheduler thread: the completion of a handler's own read (tagged PrefixRead) goes to its
    load's future, or, the read abandoned, its pages go back now that nothing writes into them."""
    load = done.tag.load
    spans.store_read(load.trace_ctx, len(load.pages), done, rt.pool.page_nbytes)
    if load.future.set_running_or_notify_cancel():
        load.future.set_result(done)
    else:
        rt.allocator.release(list(load.page_ids))


def start_load(rt, req: DecodeRequest, pages: tuple[int, ...]) -> PrefixLoad | None:
    """D's own store read of `pages` (prompt page indexes) into its pages, on the I/O thread."""
    if not pages:
        return None
    load = PrefixLoad(pages, tuple(req.page_ids[i] for i in pages), trace_ctx=req.trace_ctx)
    keys = [store_key(rt.fingerprint, req.page_hashes[i]) for i in pages]
    rt.store_io.submit_load(PrefixRead(load), keys, rt.pool.page_addrs(list(load.page_ids)))
    return load
