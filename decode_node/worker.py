"""The decode worker's gRPC handler side: the Generate RPC (`DecodeServicer`, a gRPC handler thread; thin
transport, errors mapped by pdorch.worker.errors) over `DecodeWorker`, which runs one request end to end
on that thread, decoding on the scheduler. Abort, Flush, Info, Stats come from WorkerServicer
(pdorch/worker/rpc.py).

    create(job)  validate, register the request (Abort finds it from now on)
    run(req)     admit (pages for the prompt + 1 spare, waiting under the watermark with the deadline;
                 prefix-cache hits taken as they are) -> the prompt phase, one call
                 (PromptKV.fill, decode_node/prompt_kv.py): the rest of the prompt KV from the store,
                 our own forward, or Prefill on P (KV lands in our pages, first token back) -> P's
                 first token into the request's queue, join the continuous batch and stream the
                 queue's events until the final one
Failures before the batch (admission, P failing or dying, cancellation) are raised from run() as
WorkerErrors; `DecodeServicer` maps them to gRPC status codes. Any exception before the scheduler owns
the request gives its pages back: at once, or through the PageFence when P may still write into
them (decode_node/fence.py).

One deadline: the request's own (`timeout_s` from the router, else decode.request_timeout_s) bounds
the prefill call too; decode.prefill_timeout_s only caps it when the request brought no deadline.

    drain(timeout_s)  on SIGTERM, once out of discovery: new requests are refused (UNAVAILABLE, the
                 router picks another worker), streams get timeout_s to finish, and each one left
                 ends UNAVAILABLE once the pages it offloaded are in the store: the router resumes it
                 on another decode worker (router/dispatch/failover.py), which loads those pages.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time

from opentelemetry.context import Context

from decode_node import convert, spans
from decode_node.drain_writeback import submit_write_back
from decode_node.fence import PageFence
from decode_node.first_token import continue_generator, take_first_token
from decode_node.forks import fork_sequences, shared_pages
from decode_node.growth import GrowthReserve, growth_pages
from decode_node.prefill_client import PrefillClient
from decode_node.prompt_kv import PromptKV
from decode_node.request import DecodeRequest, GenerateJob
from decode_node.scheduler import DecodeScheduler
from decode_node.stopping import make_stopper
from engine.page_allocator import pages_for
from engine.tokenizer import Tokenizer
from pdorch.config import DecodeConfig, GrpcConfig, StoreConfig
from pdorch.tracing import now_ns
from pdorch.tracing.grpc_server import current_trace_ctx
from pdorch.tracing.worker_spans import request_span
from pdorch.worker.drain_writes import DrainWrites, WriteBackProgress
from pdorch.worker.errors import InvalidRequest, PeerFailed, ShuttingDown, WorkerError, grpc_errors
from pdorch.worker.grammar import request_grammar
from pdorch.worker.kv_events import worker_journal
from pdorch.worker.metrics import WorkerRecorder
from pdorch.worker.prompt_pages import reusable_pages
from pdorch.worker.rpc import WorkerServicer
from pdorch.worker.runtime import WorkerRuntime, check_integrity
from pdorch.worker.status import WorkerLoad, worker_info, worker_stats
from pdorch.worker.validate import check_prompt, require
from proto.pdorch.v1 import worker_pb2 as pb
from proto.pdorch.v1 import worker_pb2_grpc as pb_grpc
from store_client.page_hash import page_hashes

log = logging.getLogger(__name__)

ROLE = "decode"
EVENT_WAIT_S = 0.1
DRAIN_POLL_S = 0.05


class DecodeWorker:
    def __init__(self, rt: WorkerRuntime, decode: DecodeConfig, store: StoreConfig, rpc: GrpcConfig, worker_id: str,
                 recorder: WorkerRecorder | None = None):
        self.rt, self.worker_id = rt, worker_id
        self.cfg, self.store_cfg = decode, store  # the sections this worker reads
        self.recorder = recorder or WorkerRecorder(ROLE)
        self.tokenizer = rt.tokenizer if rt.tokenizer is not None else Tokenizer.from_dir(rt.model_dir)
        dc = decode
        reserve = GrowthReserve(dc.growth_reserve, min(dc.growth_reserve_min, dc.growth_reserve)) \
            if dc.growth_reserve > 0 else None
        self.scheduler = DecodeScheduler(rt, dc.max_running_requests, dc.offload_generated_kv, self.recorder,
                                         dc.max_queued_requests, dc.kv_watermark, dc.max_local_prefill_tokens,
                                         dc.prefix_cache, preemption=dc.preemption, reserve=reserve,
                                         share_inflight=dc.share_inflight_prefix)
        self.prefill_client = PrefillClient(rpc)
        # NOTE: pages P may still write into go back only when P confirms the write is over.
        self.fence = PageFence(self.scheduler.release, self.prefill_client.confirm_writes_over,
                               self.recorder.registry)
        self.prompt_kv = PromptKV(rt, decode, store, self.recorder.registry, self.recorder.count_store_loaded,
                                  self.scheduler, self.prefill_client, self.fence)
        self.max_context = rt.max_context
        self._lock = threading.Lock()
        self._requests: dict[str, DecodeRequest] = {}
        self._draining = False
        self._drain_writes: DrainWrites | None = None  # the drain's write-back (scheduler thread)
        self.recorder.bind_load(self.load, rt.allocator.num_total)
        # the evictor's removals go to the scheduler too: the prefix cache keeps what the store dropped
        self.kv_events = worker_journal(rt, store.evict_index_pages, worker_id, self.load, self.recorder.registry,
                                        self.scheduler.store_evicted, self.scheduler.store_lost)
        self.scheduler.start()

    def close(self) -> None:
        self.kv_events.stop()
        self.scheduler.stop()
        self.prompt_kv.close()
        self.fence.stop()
        self.prefill_client.close()
        self.rt.close()

    # --------------------------------------------------------------------------------- requests
    def create(self, job: GenerateJob, trace_ctx: Context | None = None) -> DecodeRequest:
        """Validate and register the request; `trace_ctx`: the Generate RPC's span (the parent of the
        request's spans, decode_node/spans.py; None when not traced)."""
        # NOTE: one position is kept free: the first decode step feeds the first token there.
        check_prompt(job.request_id, job.token_ids, self.rt.arch.vocab_size, self.max_context - 1,
                     f"max context {self.max_context} minus the first generated token")
        require(job.request_id, job.prefill_address, "prefill_address")
        self._check_fits(job)
        if self._draining:
            raise ShuttingDown(f"decode worker {self.worker_id} is draining; request {job.request_id} goes elsewhere")
        timeout_s = job.timeout_s if job.timeout_s > 0 else self.cfg.request_timeout_s
        deadline = time.monotonic() + timeout_s
        grammar = request_grammar(self.rt, job.request_id, job.params, job.token_ids, timeout_s)
        req = DecodeRequest(job=job, deadline=deadline, own_deadline=job.timeout_s > 0,
                            stopper=make_stopper(self.tokenizer, job.params, list(job.token_ids)),
                            token_ids=list(job.token_ids), generator=self.rt.sampler.make_generator(job.params),
                            grammar=grammar, trace_ctx=trace_ctx, arrived_ns=now_ns())
        request_span(trace_ctx, job.request_id)
        with self._lock:
            if job.request_id in self._requests:
                raise InvalidRequest(f"request id {job.request_id!r} is already running on this worker")
            self._requests[job.request_id] = req
        return req

    def _check_fits(self, job: GenerateJob) -> None:
        """A request the whole pool could never hold (prompt + max_tokens, up to the context limit)
        is refused now, not admitted to fail later. NOTE: the router refuses it first (it knows the
        decode workers' pools from their Info)."""
        page_size, total, n = self.rt.page_size, self.rt.allocator.num_total, job.params.n
        end = min(len(job.token_ids) + job.params.max_tokens, self.max_context)
        shared = shared_pages(len(job.token_ids), page_size) if n > 1 else 0  # n > 1: decode_node/forks.py
        need = shared + n * (pages_for(end, page_size) - shared)
        if need > total:
            many = f" for each of n={n} sequences" if n > 1 else ""
            raise InvalidRequest(
                f"request {job.request_id}: its prompt ({len(job.token_ids)} tokens) and max_tokens "
                f"({job.params.max_tokens}){many} need {need} KV pages of {page_size} tokens; this "
                f"decode worker's pool has {total} ({total * page_size} tokens, decode.num_pages)")

    def run(self, req: DecodeRequest, is_active=lambda: True):
        """Generator of DecodeEvents; raises WorkerError when the request fails before decoding."""
        try:
            yield from self._run(req, is_active)
        finally:
            with self._lock:
                self._requests.pop(req.request_id, None)
            left = [s for s in req.sequences if not s.done]
            for seq in left:  # the consumer went away mid-stream: let the scheduler drop it
                seq.cancelled = True
            if left:
                self.scheduler.wake()

    def _run(self, req: DecodeRequest, is_active):
        def cancelled() -> bool:
            return req.cancelled or not is_active()

        with spans.admission(req):
            self._admit(req, cancelled)
        self._prompt_kv(req, cancelled)
        yield from spans.streamed(req, self._stream(req, cancelled))

    def _admit(self, req: DecodeRequest, cancelled) -> None:
        """The prompt's pages: hashed once, D's prefix-cache hits taken, the rest allocated (waiting
        under the watermark with the deadline); failures raised, counted."""
        page_size, n, sequences = self.rt.page_size, req.prompt_len, req.job.params.n
        # The prompt is hashed once, here: the prefix cache looks it up, P reuses the hashes, and D
        # continues the chain when it offloads generated pages (decode_node/offload.py).
        try:
            req.page_hashes = page_hashes(list(req.job.token_ids), page_size)
            # +1 position: the first decode step feeds the first token at position n (a spare page
            # when the prompt fills its last page exactly).
            first_pages = pages_for(n + 1, page_size)
            growth = growth_pages(n, req.job.params.max_tokens, self.max_context, first_pages, page_size)
            # n > 1: one spare page per further sequence, its copy of the last page (decode_node/forks.py)
            _, req.l1_pages, req.inflight_pages = self.scheduler.admit_request(
                req, first_pages, sequences - 1, cancelled,
                lookup=() if req.job.params.prompt_logprobs is not None else
                tuple(req.page_hashes[:reusable_pages(n, page_size)]), growth=growth * sequences)
        except BaseException:  # too large, aborted, expired or overloaded while waiting for pages
            self.recorder.request_failed(aborted=req.cancelled)
            req.done = True
            raise

    def _prompt_kv(self, req: DecodeRequest, cancelled) -> None:
        """The prompt's KV in place (D's cache, the store, P or D's own forward: PromptKV.fill) and the
        request in the batch, its first events (P's first token, the forks') already in its queue; on
        failure every page is given back and the error raised."""
        try:
            res = self.prompt_kv.fill(req, cancelled)
            # n > 1: the forks start from the state before sequence 0 takes its first token
            forks = self._fork(req, res) if req.job.params.n > 1 and res is not None else []
            first = None if res is None else take_first_token(self.rt, self.recorder, req, res)
            if first is not None:
                req.emit(first)  # streamed by _stream as every later event is
            for fork, event in forks:
                self._place(req, fork, event)
            if first is None or not first.final:
                # NOTE: join BEFORE streaming: if the client goes away meanwhile (GeneratorExit), the
                # scheduler already owns the request and reaps it (cancelled) with its pages.
                self.scheduler.join(req)
        except BaseException as e:  # any exit before the scheduler owns the request gives the pages back
            # NOTE: pages P may still write into were moved to the fence by PromptKV.fill already; pages
            # D's own store read still writes into are freed by the scheduler when it completes.
            self.scheduler.give_back(req)
            self.recorder.request_failed(aborted=req.cancelled)
            req.done = True
            if isinstance(e, WorkerError):
                log.info("request %s failed before decoding: %s", req.request_id, e)
            raise
        if first is not None and first.final:  # ended at P's first token: it never joins
            self.scheduler.give_back(req)
            self.recorder.request_finished()

    def _stream(self, req: DecodeRequest, cancelled):
        """The events of every sequence, from its queue, until each has ended (or the client has gone)."""
        open_ = set(range(req.job.params.n))  # sequences still to end (each has at least one event to come)
        while open_:
            try:
                event = req.events.get(timeout=EVENT_WAIT_S)
            except queue.Empty:
                if cancelled():
                    req.cancelled = True
                    self.scheduler.wake()
                    return
                continue
            if req.handoff and event.error is not None:
                self._await_offload(req)  # the resumed stream's prefill finds these pages in the store
            yield event
            if event.error is not None:
                return  # the stream ends with it; the other sequences are cancelled (run's finally)
            if event.final:
                open_.discard(event.index)

    def _fork(self, req: DecodeRequest, res) -> list:
        """Sequences 1 .. n-1 from P's first tokens: [(fork, its first event)], placed by _place once
        sequence 0's first event is in the queue."""
        if len(res.more_first) != req.job.params.n - 1:
            raise PeerFailed(f"request {req.request_id}: prefill answered {len(res.more_first) + 1} first "
                             f"tokens for n={req.job.params.n}")
        return fork_sequences(req, res.more_first, self.tokenizer, self.max_context,
                              functools.partial(continue_generator, self.rt.sampler))

    def _place(self, req: DecodeRequest, fork: DecodeRequest, event) -> None:
        """A fork's first event into the queue, then the fork onto the scheduler before sequence 0
        joins (its copy of the prompt's last page is taken unwritten); a fork whose first token ends
        it gives its spare page back."""
        self.recorder.generated(1)
        fork.emit(event)  # NOTE: before the scheduler can emit its next one
        if event.final:
            self.recorder.request_finished()
            self.scheduler.fork_ended(req)
            return
        req.forks.append(fork)
        shared = tuple(req.page_ids[:shared_pages(req.prompt_len, self.rt.page_size)])
        self.scheduler.fork(req, fork, shared, req.page_ids[len(shared)])

    def _await_offload(self, req: DecodeRequest) -> None:
        deadline = time.monotonic() + self.store_cfg.op_timeout_s
        while len(req.io) > 0 and time.monotonic() < deadline:
            time.sleep(DRAIN_POLL_S / 5)

    def drain(self, timeout_s: float) -> int:
        """Refuse new requests, let streams finish for `timeout_s`, hand on the rest; the number
        handed on. Returns once their streams have ended (bounded by store.op_timeout_s + 5 s)."""
        self._draining = True
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if not self._requests:
                    return 0
            time.sleep(DRAIN_POLL_S)
        with self._lock:
            left = list(self._requests.values())
        for req in left:
            for seq in req.sequences:
                seq.handoff = True
        self.scheduler.wake()
        log.info("draining: handing %d streams on to other decode workers", len(left))
        deadline = time.monotonic() + self.store_cfg.op_timeout_s + 5.0
        while time.monotonic() < deadline:
            with self._lock:
                if not self._requests:
                    break
            time.sleep(DRAIN_POLL_S)
        return len(left)

    def in_flight(self) -> int:
        """Streams not ended yet (what a drain waits for)."""
        with self._lock:
            return len(self._requests)

    def start_write_back(self) -> int:
        """The drain's write-back of the prefix cache's pages the store lacks (a few chunks at a time): how many."""
        def start() -> int:
            self._drain_writes = submit_write_back(self.rt, self.store_cfg.max_pending_save_pages)
            return 0 if self._drain_writes is None else self._drain_writes.total
        return self.scheduler.call(start)

    def write_back_progress(self) -> WriteBackProgress:
        return self.scheduler.call(
            lambda: WriteBackProgress(0) if self._drain_writes is None else self._drain_writes.progress())

    def abort(self, request_id: str) -> bool:
        with self._lock:
            req = self._requests.get(request_id)
        if req is None:
            return False
        for seq in req.sequences:
            seq.cancelled = True
        self.scheduler.wake()
        return True

    def flush(self) -> int:
        """Drop the prefix cache (pages in use by requests stay with them)."""
        return self.scheduler.call(self.rt.allocator.flush)

    # ------------------------------------------------------------------------------------ status
    def load(self) -> WorkerLoad:
        free, waiting = self.scheduler.free_pages, self.scheduler.admission.waiting
        with self._lock:
            admitted = len(self._requests) - waiting
        return WorkerLoad(queued=waiting + self.scheduler.num_waiting,
                          running=max(admitted - self.scheduler.num_waiting, 0), free_pages=free,
                          active_pages=self.rt.allocator.num_total - free)

    def info(self) -> pb.WorkerInfo:
        info = worker_info(self.rt, ROLE, self.worker_id, self.load())
        info.preemptions, info.preempted_requests = self.scheduler.preemption.total, self.scheduler.num_preempted
        return info

    def stats(self) -> pb.WorkerStats:
        integrity = self.scheduler.call(lambda: check_integrity(self.rt.allocator))
        return worker_stats(self.recorder, self.info(), integrity, self.load().active_pages)


class DecodeServicer(WorkerServicer):
    """Generate here; Abort, Flush, Info, Stats from WorkerServicer."""

    def Generate(self, request, context):
        with grpc_errors(context, "Generate"):
            job = convert.job_from_proto(request)
            req = self._worker.create(job, current_trace_ctx())
            # Client cancellation (router gone): abort here, which also cancels the call to P.
            context.add_callback(lambda: self._worker.abort(job.request_id))
            for event in self._worker.run(req, is_active=context.is_active):
                if event.error is not None:
                    raise event.error
                yield convert.event_to_proto(job.request_id, event, req.prompt_len, req.cached)


def add_to_server(worker: DecodeWorker, server) -> None:
    pb_grpc.add_DecodeServiceServicer_to_server(DecodeServicer(worker), server)
