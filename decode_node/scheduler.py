"""The decode scheduler: one thread running the continuous decode batch and owning the allocator.

Other threads talk to it through its SchedulerLoop (pdorch/worker/loop.py; messages in
decode_node/messages.py): handler threads ask for a prompt's pages (`admit`, answered under the
watermark by decode_node/admission.py, the one owner of a request's admission: one call per
message), hand prefilled requests over (`join`) and give pages back (`release`, also the fence's).
Store I/O completions wake it; each goes straight to the owner of what it read or wrote, by its
tag (the `routes` in __init__).

Each step: take new requests (their prompt KV already sits in their pages, written by P), drop
aborted / expired ones, resume preempted ones that fit again, fill the batch up to
`max_running_requests` (by arrival), give every request a page for the position it feeds (when the
pool is dry: preempt the latest arrival, decode_node/preemption.py, or with decode.preemption off
fail the request), run ONE forward of 1-token chunks, sample, run the stop checks,
stream the new tokens, offload the pages that just filled (ALL of this step's pages in ONE store
write, each page owned by its request so an abort takes only its own pages out:
decode_node/step_writes.py; the step itself: decode_node/step.py), and free finished requests'
pages once no offload still reads them. Requests join and leave at every step.

A request's pages (`req.pages`, RequestPages in decode_node/request.py) change only here and in
decode_node/preemption.py: granted by admission (admit_request), taken back by the handler's
methods below while it has not joined, grown a page at a time and given back once it ended.
"""

from __future__ import annotations

import bisect
import collections
import concurrent.futures
import functools
import itertools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from decode_node import spans
from decode_node.admission import Admission, Admitted, AdmitTicket, InFlightWaits
from decode_node.drain_writeback import DrainSaved, write_back_saved
from decode_node.forks import Fork, place
from decode_node.growth import GrowthReserve, growth_pages
from decode_node.messages import Admit, Join, Release, ResumeRead, StepSaved
from decode_node.preemption import Preemption, choose_victim
from decode_node.prefix_cache import DecodePrefixCache
from decode_node.prefix_load import PrefixLoad, PrefixRead, read_done
from decode_node.request import DecodeEvent, DecodeRequest
from decode_node.restore import Restore
from decode_node.step import DecodeStep
from decode_node.step_writes import StepWrites
from engine.page_allocator import OutOfPages
from pdorch.worker.errors import Aborted, DeadlineExceeded, Overloaded, ShuttingDown, WorkerError
from pdorch.worker.loop import Evicted, SchedulerLoop

if TYPE_CHECKING:
    from store_client.io_thread import IOCompletion

log = logging.getLogger(__name__)

ADMIT_GRACE_S = 1.0  # a handler waits this long past its deadline for the scheduler's answer


class DecodeScheduler:
    def __init__(self, rt, max_running: int, offload: bool, recorder, max_queued: int = 64,
                 watermark: float = 1.0, local_prefill_tokens: int = 256, prefix_cache: bool = False,
                 preemption: bool = False, reserve: GrowthReserve | None = None, share_inflight: bool = False):
        """`preemption`: a running request that finds no page preempts one (else it fails, as before);
        `reserve`: the growth admission keeps pages back for (None: none); `share_inflight`: a request
        waits for the prompt pages another one is filling (decode_node/admission.py)."""
        self._rt = rt
        self._max_running = max_running
        self._rec = recorder
        self._page_size = rt.page_size
        self._max_context = rt.max_context
        self._reserve = reserve
        self.cache = DecodePrefixCache(rt.allocator, self._page_size, prefix_cache, recorder.registry)
        self.admission = Admission(rt.allocator, max_queued, watermark, reserve, share_inflight and prefix_cache,
                                   InFlightWaits(recorder.registry), self.cache)
        self._preempt_on = preemption
        self.preemption = Preemption(rt, self.cache, recorder.registry)
        self._arrivals = itertools.count(1)
        self._waiting: collections.deque[DecodeRequest] = collections.deque()  # by arrival
        self._running: list[DecodeRequest] = []
        self._draining: list[DecodeRequest] = []  # answered, pages still read by offload saves
        # This step's store writes: generated pages and the prompt pages this worker computed itself.
        self._writes = StepWrites(rt, self.cache, recorder)
        self._step = DecodeStep(rt, recorder, self._writes, self.cache, self.admission, self.preemption, reserve,
                                offload and rt.store_io is not None, local_prefill_tokens, self._finish)
        # Each store I/O completion goes straight to the owner of what it read or wrote, by its tag.
        routes: dict[type, Callable[[IOCompletion], None]] = {
            PrefixRead: functools.partial(read_done, rt),  # a handler's own read of prompt pages
            ResumeRead: self._resume_read,
            DrainSaved: functools.partial(write_back_saved, rt, self.cache, recorder),  # the drain's write-back
            StepSaved: self._writes.saved,
            Restore: self._writes.restore.saved}  # lost pages written again (decode_node/restore.py)
        self._loop = SchedulerLoop("decode", self._iterate, self._on_message, self._fail_all, rt.store_io,
                                   lambda done: routes[type(done.tag)](done), rt.thread_init)
        # Published by the scheduler thread every iteration, read by other threads (load figures).
        self.num_waiting = 0  # joined, not in the batch: waiting for a slot, or preempted
        self.num_running = 0
        self.num_preempted = 0
        self.free_pages = rt.allocator.num_available()

    # ---------------------------------------------------------------- called from other threads
    def start(self) -> None:
        self._loop.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._loop.stop(timeout_s)

    def admit(self, request_id: str, num_pages: int, deadline: float, is_cancelled) -> list[int]:
        """The prompt's pages (handler thread): waits, up to `deadline`, while the pool is over the
        watermark; raises InvalidRequest, Overloaded, DeadlineExceeded or Aborted."""
        return self.admit_prompt(request_id, num_pages, deadline, is_cancelled).pages

    def admit_prompt(self, request_id: str, num_pages: int, deadline: float, is_cancelled,
                     lookup: tuple[str, ...] = (), growth: int = 0) -> Admitted:
        """As admit(), looking the leading pages' hashes `lookup` up in the prefix cache first (when
        it is on): the page ids, the indexes of the pages found there, and how many of those it
        waited for while another request filled them. `growth`: pages the request may need after
        these (admission keeps a share of it back, decode_node/growth.py)."""
        ticket = AdmitTicket(request_id, num_pages, deadline, is_cancelled, lookup=tuple(lookup), growth=growth)
        self._loop.post(Admit(ticket))
        try:  # the scheduler answers at the deadline; the grace covers a forward in progress
            pages = ticket.future.result(timeout=max(0.0, deadline - time.monotonic()) + ADMIT_GRACE_S)
        except concurrent.futures.TimeoutError:
            if ticket.future.cancel():  # the scheduler never got to it: it will drop the ticket
                raise DeadlineExceeded(f"request {request_id} got no KV pages before its deadline") from None
            pages = ticket.future.result(timeout=ADMIT_GRACE_S)  # being answered right now
        return Admitted(pages, ticket.hits, ticket.shared)

    # A request's pages while its handler thread holds it (before it joins the batch, or when it ends
    # at its first token): granted at admission, taken back by the methods after it.
    def admit_request(self, req: DecodeRequest, num_pages: int, spare: int, is_cancelled, lookup: tuple[str, ...] = (),
                      growth: int = 0) -> Admitted:
        """admit_prompt() for `req`, its pages granted to it: `num_pages` for its prompt and `spare`
        more (n > 1: its forks' copies of the last page, decode_node/forks.py)."""
        admitted = self.admit_prompt(req.request_id, num_pages + spare, req.deadline, is_cancelled, lookup, growth)
        req.pages.grant(admitted.pages[:num_pages], admitted.pages[num_pages:])
        return admitted

    def give_back(self, req: DecodeRequest) -> None:
        """`req` ended before joining the batch (or at its first token): every page it holds, spare
        ones too, goes back and its admission is settled."""
        self.release(req.pages.take_all(), req.request_id)

    def take_pages(self, req: DecodeRequest) -> list[int]:
        """`req`'s prompt pages leave it before it joined (P may still write into them: the fence,
        decode_node/fence.py, gives them back once P says it stopped)."""
        return req.pages.take()

    def drop_abandoned(self, req: DecodeRequest, load: PrefixLoad) -> None:
        """D's own store read of `req`'s pages was abandoned (decode_node/prefix_load.py): its pages
        leave `req`; this thread frees them once the read completes (prefix_load.read_done)."""
        req.pages.drop(load.page_ids)

    def store_evicted(self, keys) -> None:
        """Called by the store evictor's thread: these keys left the store."""
        self._loop.post(Evicted(tuple(keys)))

    def store_lost(self, keys) -> None:
        """Called by the store connector's thread: a master leader switch lost these keys."""
        self._loop.post(Evicted(tuple(keys), lost=True))

    def join(self, req: DecodeRequest) -> None:
        """Hand a prefilled request to the batch (from a handler thread)."""
        self._loop.post(Join(req))

    def fork(self, parent: DecodeRequest, fork: DecodeRequest, shared: tuple[int, ...], tail: int) -> None:
        """Hand `fork`, a sequence of prefilled `parent` (n > 1, decode_node/forks.py), to the batch
        with one of the parent's spare pages; posted before the parent joins, so its copy of the
        prompt's last page is taken unwritten."""
        self._loop.post(Fork(fork, shared, tail, parent.pages.take_spare()))

    def fork_ended(self, parent: DecodeRequest) -> None:
        """A fork of `parent` ended at its first token: the spare page admitted for it goes back."""
        self.release([parent.pages.take_spare()])

    def release(self, page_ids, request_id: str = "") -> None:
        """Give pages back (any thread): a request that failed before joining (`request_id`: its
        admission is settled too), or the fence."""
        if page_ids or request_id:
            self._loop.post(Release(tuple(page_ids), request_id))

    def wake(self) -> None:
        """Make the loop look at cancellations now (Abort sets req.cancelled, then calls this)."""
        self._loop.wake()

    def call(self, fn, timeout_s: float = 30.0):
        """Run fn() on the scheduler thread (flush, integrity checks) and return its result."""
        return self._loop.call(fn, timeout_s)

    # ------------------------------------------------------------------------- scheduler thread
    def _iterate(self, now: float) -> bool:
        index = self._rt.chain_index
        if index is not None:  # ended conversations leave the prefix cache first, as they leave the store
            self._rt.allocator.stale_after = index.stale_after()
        self._release_drained()
        self.preemption.settle()
        self._reap(now)
        self._resume_ready(now)
        growth = self._growth() if self.admission.waiting else 0  # NOTE: a pass over the batch, only when asked
        self.admission.admit_ready(now, self._loop.wake_at, growth, hold=bool(self.preemption.waiting))
        while self._waiting and len(self._running) < self._max_running:
            self._running.append(self._waiting.popleft())
        worked = self._step.run(self._running, self._grow()) if self._running else False
        self._publish()
        return worked

    def _publish(self) -> None:
        self.num_preempted = len(self.preemption.waiting) + len(self.preemption.reading)
        self.num_waiting, self.num_running = len(self._waiting) + self.num_preempted, len(self._running)
        self.free_pages = self._rt.allocator.num_available()
        self.cache.sync_metrics()

    def _fail_all(self, err: WorkerError) -> None:
        for req in self._running + list(self._waiting) + self.preemption.requests():
            self._finish(req, DecodeEvent(error=err))
        self.admission.fail_all(err)
        self._publish()

    def _on_message(self, msg) -> None:
        if isinstance(msg, Admit):
            self.admission.admit(msg.ticket, time.monotonic(), self._loop.wake_at, self._growth(),
                                 hold=bool(self.preemption.waiting))
        elif isinstance(msg, Join):
            self.admission.joined(msg.req)
            msg.req.arrival = next(self._arrivals)
            self._waiting.append(msg.req)
        elif isinstance(msg, Fork):
            msg.req.pages.reset(place(msg, self._rt.allocator, self._rt.runner))
            msg.req.arrival = next(self._arrivals)
            self._waiting.append(msg.req)
        elif isinstance(msg, Release):
            if msg.request_id:
                self.admission.ended(msg.request_id)
            self._rt.allocator.release(list(msg.page_ids))
        elif isinstance(msg, Evicted) and msg.lost:  # written again from L1 (decode_node/restore.py)
            self._writes.restore.rewrite(msg.keys)
        elif isinstance(msg, Evicted):
            self.cache.left_store([k.rpartition("/")[2] for k in msg.keys])
        else:
            raise TypeError(f"decode scheduler: unknown message {msg!r}")

    def _resume_read(self, done) -> None:
        """A preempted request's pages are back from the store (ResumeRead)."""
        req = self.preemption.read_done(done)
        if req is not None:
            self._ready(req, time.monotonic())

    def _release_drained(self) -> None:
        still = []
        for req in self._draining:
            if len(req.io) > 0:
                still.append(req)
            else:
                self._release(req)
        self._draining = still

    def _reap(self, now: float) -> None:
        # NOTE: a resume whose store read is in flight too: it ends now, its pages go back when the read lands
        reading = [r for r in self.preemption.reading if not r.done]
        for req in self._running + list(self._waiting) + list(self.preemption.waiting) + reading:
            self._loop.wake_at(req.deadline)  # no later than its deadline, however idle
            if req.cancelled:
                self._finish(req, DecodeEvent(error=Aborted(f"request {req.request_id} aborted")), aborted=True)
            elif req.handoff:  # NOTE: not aborted: its queued offload pages are still written
                self._finish(req, DecodeEvent(error=ShuttingDown(
                    f"decode worker draining: request {req.request_id} hands on after {req.num_generated} tokens")))
            elif now > req.deadline:
                self._finish(req, DecodeEvent(error=DeadlineExceeded(
                    f"request {req.request_id} missed its deadline ({req.job.timeout_s:.1f}s) after "
                    f"{req.num_generated} generated tokens")))

    def _finish(self, req: DecodeRequest, event: DecodeEvent, aborted: bool = False) -> None:
        """Send the final event and take the request out of the batch; pages go back once no save reads them."""
        req.emit(event)
        if req.compute.todo:  # ended before its prompt was in place (else its claims ended then)
            self.admission.ended(req.request_id)
        if event.error is None:
            self._rec.request_finished()
        else:
            self._rec.request_failed(aborted=aborted)
        if req in self.preemption.reading:  # its pages go back when the store read is over (read_done)
            return
        self.preemption.forget(req)
        if aborted and len(req.io) > 0:
            self._rt.store_io.cancel_owner(req)  # its queued offload pages are not written
        if req in self._running:
            self._running.remove(req)
        elif req in self._waiting:
            self._waiting.remove(req)
        if len(req.io) > 0:
            self._draining.append(req)
        else:
            self._release(req)

    def _release(self, req: DecodeRequest) -> None:
        if req.page_ids:
            self._rt.allocator.release(req.pages.take())

    # ------------------------------------------------------------------ growth and preemption
    def _growth(self) -> int:
        """Pages the requests in the batch may still need (the reserve admission keeps back)."""
        if self._reserve is None:
            return 0
        return sum(self._growth_of(r, len(r.page_ids)) for r in itertools.chain(self._running, self._waiting))

    def _growth_of(self, req: DecodeRequest, held_pages: int) -> int:
        return growth_pages(req.prompt_len, req.job.params.max_tokens, self._max_context, held_pages,
                            self._page_size)

    def _resume_ready(self, now: float) -> None:
        """Resume preempted requests, oldest first, while admission's check says they fit (or nothing
        else is in the batch and the pool has their pages)."""
        pre = self.preemption
        while pre.waiting:
            req = pre.waiting[0]
            if req.preempt.parked_pages:  # still holds pages an offload write reads
                return
            need = pre.pages_to_resume(req)
            alone = not self._running and not self._waiting and not pre.reading
            growth = self._growth() + self._growth_of(req, need + len(req.preempt.kept_pages))
            if not ((alone and need <= self._rt.allocator.num_available()) or self.admission.fits(need, growth)):
                if alone:  # nothing runs that could free pages: the others' kept pages make room
                    pre.drop_tails()
                self._loop.wake_at(req.deadline)
                return
            if pre.resume(req):
                self._ready(req, now)

    def _ready(self, req: DecodeRequest, now: float) -> None:
        """A resumed request goes back to the batch ahead of every later arrival."""
        if not req.compute.todo:
            self.preemption.resumed(req, now)
        i = bisect.bisect(self._waiting, req.arrival, key=lambda r: r.arrival)
        self._waiting.insert(i, req)

    def _grow(self) -> set[DecodeRequest]:
        """Every decoding request gets a page for the position it feeds now, oldest first. When the
        pool has none: preempt the latest arrival (possibly the request itself); the requests that
        get no page this step (a victim's pages come back once its offload write completes) are
        returned. With decode.preemption off the request fails instead (the behaviour before it)."""
        stalled: set[DecodeRequest] = set()
        for req in sorted(self._running, key=lambda r: r.arrival):
            if req.compute.todo or (len(req.token_ids) - 1) // self._page_size < len(req.page_ids):
                continue
            while req in self._running:
                try:
                    req.pages.extend(self._rt.allocator.allocate(1))
                    break
                except OutOfPages:
                    pass
                if not self._preempt_on or len(req.page_ids) >= self._rt.allocator.num_total:
                    self._finish(req, DecodeEvent(error=Overloaded(
                        f"KV pool exhausted while decoding {req.request_id} (raise decode.num_pages or lower "
                        f"decode.kv_watermark)")))
                elif self.preemption.returning():
                    stalled.add(req)
                    break
                else:
                    self._preempt(choose_victim([r for r in self._running if not r.compute.todo]))
        return stalled

    def _preempt(self, victim: DecodeRequest) -> None:
        self._running.remove(victim)
        self.preemption.preempt(victim, time.monotonic())
        victim.emit(DecodeEvent(preemptions=1, paused=True))  # at once: the router keeps its client meanwhile
        spans.preempted(victim)
        if self._reserve is not None:
            self._reserve.preempted()
        log.info("preempted %s after %d generated tokens (%d preempted now)", victim.request_id,
                 victim.num_generated, len(self.preemption.waiting))
