"""The prefill worker's gRPC handler side: the Prefill RPC (`PrefillServicer`, a gRPC handler thread
each) validates the job, hands the task to the scheduler thread and waits for its answer with the
deadline (`PrefillWorker`); Abort, Flush, Info, Stats come from WorkerServicer (pdorch/worker/rpc.py).

Thread model: gRPC handler threads call `start()` + `wait()` (blocking until the answer or the
deadline), `cancel()`, `abort()`, `flush()`, `info()`, `stats()`; the scheduler thread does all model
and allocator work; the pusher threads run the P->D transfers.

NOTE: a failure is answered only once the task's push into D's pages has stopped (or never will
start): D returns those pages to its pool when it has our answer, so an answer sent while the
write still ran would let it land in pages another request owns. `wait()` waits up to
PUSH_STOP_WAIT_S for that; `PrefillServicer.Prefill` tells D with the `writes_over` flag in the
trailing metadata.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time

from opentelemetry.context import Context

from engine.page_allocator import pages_for
from pdorch.config import PrefillConfig
from pdorch.tracing.grpc_server import current_trace_ctx
from pdorch.tracing.worker_spans import request_span
from pdorch.worker import convert
from pdorch.worker.drain_writes import WriteBackProgress
from pdorch.worker.errors import DeadlineExceeded, InvalidRequest, Overloaded, grpc_errors
from pdorch.worker.grammar import request_grammar
from pdorch.worker.kv_events import worker_journal
from pdorch.worker.metrics import WorkerRecorder
from pdorch.worker.prefill_rpc import WRITES_OVER_KEY, PrefillJob, PrefillResult
from pdorch.worker.prompt_pages import reusable_pages
from pdorch.worker.rpc import WorkerServicer
from pdorch.worker.runtime import WorkerRuntime, check_integrity
from pdorch.worker.status import worker_info, worker_stats
from pdorch.worker.validate import check_prompt, require
from prefill_node.messages import Abort, Cancel, Submit
from prefill_node.pusher import KVPusher
from prefill_node.scheduler import PrefillScheduler
from prefill_node.task import PrefillTask
from proto.pdorch.v1 import worker_pb2 as pb
from proto.pdorch.v1 import worker_pb2_grpc as pb_grpc
from store_client.config import StoreConfig

log = logging.getLogger(__name__)

ROLE = "prefill"
PUSH_STOP_WAIT_S = 5.0  # a failed request's answer waits this long at most for its push to return
ABORT_STOP_WAIT_S = 2.0  # an Abort RPC waits this long at most (D retries it until its own bound)


class PrefillWorker:
    def __init__(self, rt: WorkerRuntime, cfg: PrefillConfig, store: StoreConfig, worker_id: str,
                 recorder: WorkerRecorder | None = None):
        """`cfg`, `store`: the config sections this worker reads (`prefill`, `store`), handed on to the
        scheduler; the model's limits come from `rt`."""
        self.rt = rt
        self.cfg = cfg
        self.worker_id = worker_id
        self.recorder = recorder or WorkerRecorder(ROLE)
        self._pusher = KVPusher(rt.peer_transfer, rt.pool.page_nbytes, thread_init=rt.thread_init)
        self._scheduler = PrefillScheduler(rt, cfg, store, self._pusher, self.recorder)
        self.recorder.bind_load(lambda: self._scheduler.load, rt.allocator.num_total)
        # the evictor's removals go to the scheduler too: L1 keeps what the store dropped
        self.kv_events = worker_journal(rt, store.evict_index_pages, worker_id, lambda: self._scheduler.load,
                                        self.recorder.registry, self._scheduler.store_evicted,
                                        self._scheduler.store_lost)
        self._scheduler.publish_claims(self.kv_events.inflight_claimed, self.kv_events.inflight_released)
        self._scheduler.start()

    def close(self) -> None:
        self.kv_events.stop()
        self._scheduler.stop()
        self._pusher.close()
        self.rt.close()

    # --------------------------------------------------------------------------------- requests
    def validate(self, job: PrefillJob) -> None:
        rt, page_size = self.rt, self.rt.page_size
        check_prompt(job.request_id, job.token_ids, rt.arch.vocab_size, rt.max_context, "max context")
        require(job.request_id, job.decode_segment, "decode_segment")
        if job.page_size != page_size:
            raise InvalidRequest(f"request {job.request_id}: page_size {job.page_size} != this worker's {page_size}")
        if job.model_fingerprint and job.model_fingerprint != rt.fingerprint:
            raise InvalidRequest(f"request {job.request_id}: model_fingerprint {job.model_fingerprint!r} != "
                                 f"this worker's {rt.fingerprint!r} (different model, dtype or layout)")
        num_pages = pages_for(len(job.token_ids), page_size)
        if len(job.dest_page_addrs) != num_pages:
            raise InvalidRequest(f"request {job.request_id}: {len(job.dest_page_addrs)} dest_page_addrs for "
                                 f"{len(job.token_ids)} tokens; expected {num_pages} (page_size {page_size})")
        if num_pages > rt.allocator.num_total:
            raise InvalidRequest(f"request {job.request_id}: needs {num_pages} pages, the pool has "
                                 f"{rt.allocator.num_total}")
        if job.page_hashes and len(job.page_hashes) != len(job.token_ids) // page_size:
            raise InvalidRequest(f"request {job.request_id}: {len(job.page_hashes)} page_hashes for "
                                 f"{len(job.token_ids) // page_size} full pages")
        loaded, n_reuse = job.decode_loaded_pages, reusable_pages(len(job.token_ids), page_size)
        if list(loaded) != sorted(set(loaded)) or (loaded and not 0 <= loaded[0] <= loaded[-1] < n_reuse):
            raise InvalidRequest(f"request {job.request_id}: decode_loaded_pages must be ascending distinct indexes "
                                 f"of reusable pages (< {n_reuse})")
        held = job.decode_cached_pages
        if list(held) != sorted(set(held)) or not set(held) <= set(loaded):
            raise InvalidRequest(f"request {job.request_id}: decode_cached_pages must be ascending distinct indexes "
                                 "among decode_loaded_pages")

    def prefill(self, job: PrefillJob) -> PrefillResult:
        return self.wait(self.start(job))

    def start(self, job: PrefillJob, trace_ctx: Context | None = None) -> PrefillTask:
        """Validate and queue the job; the task's answer comes from wait(). `trace_ctx`: the Prefill
        RPC's span (the parent of the task's spans; None when not traced)."""
        self.validate(job)
        if self._scheduler.load.queued >= self.cfg.max_queued_requests:
            raise Overloaded(f"prefill queue full ({self.cfg.max_queued_requests} requests waiting)")
        timeout_s = job.timeout_s if job.timeout_s > 0 else self.cfg.request_timeout_s
        deadline = time.monotonic() + timeout_s
        grammar = request_grammar(self.rt, job.request_id, job.params, job.token_ids, timeout_s)
        task = PrefillTask(job=job, deadline=deadline, grammar=grammar, trace_ctx=trace_ctx)
        request_span(trace_ctx, job.request_id)
        self._scheduler.post(Submit(task))
        return task

    def wait(self, task: PrefillTask) -> PrefillResult:
        """The task's result; on failure raises only once its push stopped (or PUSH_STOP_WAIT_S passed)."""
        timeout_s = task.deadline - task.created
        try:
            # The scheduler fails the task at its deadline; the extra second covers a forward in progress.
            return task.future.result(timeout=timeout_s + 1.0)
        except concurrent.futures.TimeoutError:
            self._scheduler.post(Cancel(task))
            raise DeadlineExceeded(f"prefill of {task.request_id} did not finish within {timeout_s:.1f}s") from None
        finally:
            if not task.push.stop(PUSH_STOP_WAIT_S):
                log.warning("KV push of %s to %s still running after %.1fs; answering without writes_over",
                            task.request_id, task.job.decode_segment, PUSH_STOP_WAIT_S)

    def cancel(self, task: PrefillTask) -> None:
        """The task's RPC ended (D cancelled or died): stop its push from starting and abort it. Never blocks.
        An answered task needs neither: no transfer starts once it is answered (PushGate.begin), and
        wait() waits for one still running."""
        if task.future.done():
            return
        task.push.stop(0.0)
        self._scheduler.post(Cancel(task))

    def abort(self, request_id: str, wait: bool = True) -> bool:
        """Cancel a request. With wait (the Abort RPC), return only once no push of it into D's pages
        runs any more, or raise DeadlineExceeded after ABORT_STOP_WAIT_S (D asks again)."""
        if not wait:
            self._scheduler.post(Abort(request_id))
            return True

        def _abort_known() -> tuple[bool, list[PrefillTask]]:
            known = self._scheduler.live_task(request_id) is not None
            self._scheduler.post(Abort(request_id))
            return known, self._scheduler.tasks_with_id(request_id)
        known, tasks = self._scheduler.call(_abort_known)
        deadline = time.monotonic() + ABORT_STOP_WAIT_S
        for task in tasks:
            if not task.push.stop(max(deadline - time.monotonic(), 0.0)):
                raise DeadlineExceeded(f"KV push of {request_id} to {task.job.decode_segment} still running "
                                       f"after {ABORT_STOP_WAIT_S:.1f}s")
        return known

    def flush(self) -> int:
        return self._scheduler.call(self.rt.allocator.flush)

    # ------------------------------------------------------------------------------------- drain
    def in_flight(self) -> int:
        """Prefills queued or running (what a drain waits for)."""
        load = self._scheduler.load
        return load.queued + load.running

    def start_write_back(self) -> int:
        """The drain's write-back of the L1 pages the store lacks (Persister.write_back_unstored): how many."""
        return self._scheduler.call(self._scheduler.persister.write_back_unstored)

    def write_back_progress(self) -> WriteBackProgress:
        return self._scheduler.call(self._scheduler.persister.drain_progress)

    # ------------------------------------------------------------------------------------ status
    def info(self) -> pb.WorkerInfo:
        return worker_info(self.rt, ROLE, self.worker_id, self._scheduler.load)

    def stats(self) -> pb.WorkerStats:
        integrity = self._scheduler.call(lambda: check_integrity(self.rt.allocator))
        load = self._scheduler.load
        return worker_stats(self.recorder, self.info(), integrity, load.active_pages)


class PrefillServicer(WorkerServicer):
    """The Prefill RPC here; Abort, Flush, Info, Stats from WorkerServicer. Errors mapped by grpc_errors."""

    _worker: PrefillWorker

    def Prefill(self, request, context):
        task = None
        with grpc_errors(context, "Prefill"):
            try:
                job = convert.job_from_proto(request)
                task = self._worker.start(job, current_trace_ctx())
                # Fires when the RPC ends for any reason; after a success the cancel is a no-op. When D
                # cancels (its client went away) or dies, this frees our pages at once.
                # NOTE: registered after start(): an RPC already over (D cancelled before we got here)
                # returns False, and the task is cancelled before any push of it can start.
                if not context.add_callback(lambda: self._worker.cancel(task)):
                    self._worker.cancel(task)
                return convert.result_to_proto(self._worker.wait(task))
            finally:
                if task is None or task.push.writes_over:  # never queued, or its push is over
                    context.set_trailing_metadata(((WRITES_OVER_KEY, "1"),))


def add_to_server(worker: PrefillWorker, server) -> None:
    pb_grpc.add_PrefillServiceServicer_to_server(PrefillServicer(worker), server)
