"""Run one request on a P/D pair: pick workers, stream from D, retry once before the first token.

    pick P (policy) + D (least load) --> D.Generate(token ids, prefill_address=P) --> chunks

- The Generate stream runs on router/grpc_stream.py (the event loop reads the worker's socket
  itself); chunks that arrive together are handed on together, so they cost one client write.

- One deadline per request, end to end: `Job.deadline` is fixed when the job is made (the request's
  arrival); every attempt gets only what remains of it, and that remainder is the deadline D gets
  (for its prefill call too). A request whose deadline passed is never retried.
- Before the first token arrives, a failure is retried once on a different P/D pair (the
  failed workers are excluded when others are routable). Which worker failed is decided by
  probing both with Info; the one that does not answer gets the circuit-breaker failure. The
  probes never hold the answer past the deadline (after the last attempt they run after it).
- After the first token, a failure ends the stream with `StreamFailed` (the HTTP layer turns it
  into an error event; the client already has a 200).
- Closing the generator (client disconnect) cancels the gRPC call; D propagates it to P.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc

from proto.pdorch.v1 import worker_pb2
from router.errors import APIError, bad_request, overloaded, unavailable, upstream_error
from router.grpc_stream import RpcError, StreamCall
from router.metrics import RouterMetrics
from router.policies import Policy, RouteContext, SessionAffinity
from router.workers import Worker, WorkerPool

log = logging.getLogger("pdorch.router")

# gRPC codes that mean "the request itself is bad": answered 400, never retried.
_CLIENT_CODES = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE}
GENERATE_PATH = "/pdorch.v1.DecodeService/Generate"


class StreamFailed(Exception):
    """The request failed after tokens were already streamed to the client."""


@dataclass
class Job:
    request_id: str
    token_ids: list[int]
    sampling: worker_pb2.SamplingParams
    page_hashes: list[str]
    timeout_s: float  # the whole request's budget
    session: str | None = None
    deadline: float = 0.0  # time.monotonic() by which the request must be done; 0 = timeout_s from now

    def __post_init__(self):
        if not self.deadline:
            self.deadline = time.monotonic() + self.timeout_s

    def remaining_s(self) -> float:
        return self.deadline - time.monotonic()


class Dispatcher:
    def __init__(self, pool: WorkerPool, policy: Policy, metrics: RouterMetrics, max_attempts: int = 2):
        self.pool = pool
        self.policy = policy
        self.metrics = metrics
        self.max_attempts = max_attempts
        self.affinity = SessionAffinity()
        self._probes: set[asyncio.Task] = set()  # blame probes running after a request was answered
        pool.on_remove.append(policy.forget)

    def has_capacity(self) -> tuple[bool, bool]:
        return bool(self.pool.routable("prefill")), bool(self.pool.routable("decode"))

    def _pick(self, job: Job, tried_p: set, tried_d: set) -> tuple[Worker, Worker]:
        prefills = self.pool.routable("prefill", tried_p) or self.pool.routable("prefill")
        decodes = self.pool.routable("decode", tried_d) or self.pool.routable("decode")
        if not prefills or not decodes:
            missing = " and ".join(r for r, ws in (("prefill", prefills), ("decode", decodes)) if not ws)
            raise unavailable(f"no healthy {missing} worker is available; retry later")
        ctx = RouteContext(job.page_hashes, job.session)
        p = self.affinity.lookup(job.session, prefills) if job.session else None
        if p is None:
            p = self.policy.choose(prefills, ctx)
            if job.session:
                self.affinity.remember(job.session, p)
        self.policy.on_routed(p, ctx)
        return p, self.policy.choose_decode(decodes)

    async def _blame(self, p: Worker, d: Worker, error: str) -> None:
        """Probe both workers; charge the failure to whichever does not answer (D if both do)."""
        ok_p, ok_d = await asyncio.gather(self.pool.check(p), self.pool.check(d))
        for w, ok in ((p, ok_p), (d, ok_d)):
            if not ok:
                self.pool.record_failure(w, error)
                self.metrics.worker_errors.labels(w.role, w.address).inc()
        if ok_p and ok_d:
            self.pool.record_failure(d, error)
            self.metrics.worker_errors.labels(d.role, d.address).inc()

    async def _charge(self, p: Worker, d: Worker, error: str, job: Job, final: bool) -> None:
        """Blame: before a retry wait for the probes (the retry should go to healthy workers), at most
        until the deadline; after the last attempt not at all. The probes (up to 2 s on a hung
        worker) must not hold the answer past the request's deadline; they finish in the background."""
        task = asyncio.get_running_loop().create_task(self._blame(p, d, error))
        self._probes.add(task)  # NOTE: a reference, or the task may be collected before it ends
        task.add_done_callback(self._probes.discard)
        if not final and job.remaining_s() > 0:
            await asyncio.wait((task,), timeout=job.remaining_s())

    async def stream(self, job: Job) -> AsyncIterator[list[worker_pb2.GenerateResponse]]:
        """Yield D's chunks in batches (all that arrived together; the first batch holds the first
        token). Raises APIError before the first token, StreamFailed after it."""
        tried_p: set[Worker] = set()
        tried_d: set[Worker] = set()
        last_error: APIError | None = None
        for attempt in range(self.max_attempts):
            remaining = job.remaining_s()
            if attempt:
                if remaining <= 0 or last_error.type == "timeout":
                    break  # NOTE: a retry never gets a fresh deadline (issue 14, hazard 3)
                self.metrics.retries.inc()
                log.warning("request %s failed before its first token (%s); retrying with %.1f s left",
                            job.request_id, last_error.message, remaining)
            elif remaining <= 0:
                raise _timeout(f"the request's deadline ({job.timeout_s:g} s) passed before it reached a worker")
            p, d = self._pick(job, tried_p, tried_d)
            tried_p.add(p)
            tried_d.add(d)
            req = worker_pb2.GenerateRequest(request_id=job.request_id, token_ids=job.token_ids,
                                             sampling=job.sampling, prefill_address=p.address,
                                             timeout_s=remaining)
            for w in (p, d):
                w.in_flight += 1
                w.routed += 1
                w.breaker.on_sent()
                self.metrics.worker_routed.labels(w.role, w.address).inc()
            call: StreamCall | None = None
            p_held, d_held, finished = True, True, False
            try:
                first: list[worker_pb2.GenerateResponse] = []
                try:
                    call = await d.calls.call(GENERATE_PATH, req.SerializeToString(),
                                              worker_pb2.GenerateResponse.FromString, remaining)
                    while True:
                        batch = await call.next_batch()
                        if not batch:
                            raise _EarlyEOF()
                        first.extend(batch)
                        if any(m.token_ids or m.finish_reason for m in batch):
                            break
                except (RpcError, _EarlyEOF) as e:
                    p.in_flight -= 1
                    d.in_flight -= 1
                    p_held = d_held = False
                    final = attempt + 1 >= self.max_attempts
                    last_error = await self._first_token_failure(e, p, d, job, final)
                    continue
                # First token: prefill is done, P's share of the load ends here.
                p.in_flight -= 1
                p_held = False
                self.pool.record_success(p)
                batch = first
                while True:
                    # NOTE: the chunk with finish_reason is the last one: the request is complete
                    # here, so a consumer that stops reading after it must not cancel the call.
                    if batch[-1].finish_reason:
                        finished = self._done(d)
                    yield batch
                    if finished:
                        return
                    try:
                        batch = await call.next_batch()
                    except RpcError as e:
                        self.pool.record_failure(d, f"{e.code().name}: {e.details()}")
                        self.metrics.worker_errors.labels(d.role, d.address).inc()
                        raise StreamFailed(f"decode worker {d.address} failed mid-stream: "
                                           f"{e.code().name}: {e.details()}") from None
                    if not batch:
                        finished = self._done(d)  # ended without a finish_reason: still a clean end
                        return
            finally:
                if p_held:
                    p.in_flight -= 1
                if d_held:
                    d.in_flight -= 1
                if not finished and call is not None:
                    call.cancel()  # client went away (or we failed): stop the work on D and P
        assert last_error is not None
        raise last_error

    def _done(self, d: Worker) -> bool:
        self.pool.record_success(d)
        return True

    async def _first_token_failure(self, e: Exception, p: Worker, d: Worker, job: Job, final: bool) -> APIError:
        if isinstance(e, _EarlyEOF):
            msg = f"decode worker {d.address} ended the stream before the first token"
            await self._charge(p, d, msg, job, final)
            return upstream_error(msg)
        code, details = e.code(), e.details()
        if code in _CLIENT_CODES:
            raise bad_request(f"rejected by worker: {details}")
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return overloaded(f"workers are at capacity: {details}")
        msg = f"worker request failed before the first token (P={p.address}, D={d.address}): {code.name}: {details}"
        await self._charge(p, d, f"{code.name}: {details}", job, final or code == grpc.StatusCode.DEADLINE_EXCEEDED)
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return _timeout(msg)
        return unavailable(msg) if code == grpc.StatusCode.UNAVAILABLE else upstream_error(msg)


def _timeout(message: str) -> APIError:
    return APIError(504, message, "timeout")


class _EarlyEOF(Exception):
    pass
