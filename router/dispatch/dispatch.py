"""Run one request on a P/D pair: pick workers, stream from D, retry once before the first token,
resume on another D when D dies mid-stream.

    P and D (Policy.route) --> D.Generate(token ids, prefill_address=P) --> chunks

- The Generate stream runs on router/grpc/stream.py (the event loop reads the worker's socket
  itself); chunks that arrive together are handed on together, so they cost one client write.

- One deadline per request, end to end: `Job.deadline` is fixed when the job is made (the request's
  arrival); every attempt gets only what remains of it, and that remainder is the deadline D gets
  (for its prefill call too). A request whose deadline passed is never retried.
- Before the first token arrives, a failure is retried once on a different P/D pair (the
  failed workers are excluded when others are routable). Which worker failed is decided by
  probing both with Info; the one that does not answer gets the circuit-breaker failure. The
  probes never hold the answer past the deadline (after the last attempt they run after it).
- After the first token, a decode worker that is gone (UNAVAILABLE: connection lost) is replaced:
  with mid-stream failover on, the stream resumes on another D with the prompt + the tokens already
  streamed (router/dispatch/failover.py), at most MAX_FAILOVERS times per request. Any other failure after
  the first token, or a resumption that fails, ends the stream with `StreamFailed` (the HTTP layer
  turns it into an error event; the client already has a 200).
- D's last chunk ends the stream: its attempt is closed (D's share of the load given back) before
  that chunk is handed on, so a consumer that reads to the end closes nothing itself.
- Closing the generator early (client disconnect) cancels the gRPC call; D propagates it to P.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator
from typing import NamedTuple

import grpc

from pdorch.worker.prefill_rpc import CACHE_TIERS
from proto.pdorch.v1 import worker_pb2
from router.dispatch.failover import MAX_FAILOVERS, Resumption
from router.dispatch.policies import Policy
from router.dispatch.request_trace import RequestTrace
from router.errors import APIError, bad_request, overloaded, unavailable, upstream_error
from router.fleet.workers import Worker, WorkerPool
from router.grpc.stream import RpcError, StreamCall
from router.metrics import RouterMetrics

log = logging.getLogger("pdorch.router")

# gRPC codes that mean "the request itself is bad": answered 400, never retried.
_CLIENT_CODES = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE}
GENERATE_PATH = "/pdorch.v1.DecodeService/Generate"
# A retry waits this long at most for the probes of the pair that failed (each is bounded at 2 s; a new
# channel's set-up may add to it): a probe that somehow never ends must not hold the request to its deadline.
PROBE_WAIT_S = 5.0


class StreamFailed(Exception):
    """The request failed after tokens were already streamed to the client."""


class Job(NamedTuple):
    """One request as the router dispatches it: fixed once made (a retry or a failover reads it,
    never changes it; what changes per attempt lives in `_Attempt`).
    NOTE: a NamedTuple, as the other records made per request (JobSpec, Route, BodySampling): as
    immutable as a frozen dataclass, whose __init__ sets each field through object.__setattr__
    (~0.5 µs for six fields against ~0.19 µs)."""

    request_id: str
    token_ids: list[int]
    sampling: worker_pb2.SamplingParams
    page_hashes: list[str]
    timeout_s: float  # the whole request's budget
    deadline: float  # time.monotonic() by which the request must be done
    session: str | None = None
    grammar_param: str = ""  # the body field its grammar came from: a worker's refusal of it names that field
    kv_tokens: int = 0  # KV the request may need on its decode worker (prompt + output): D is one whose pool holds it
    trace: RequestTrace | None = None  # its spans (router/dispatch/request_trace.py); None = tracing off

    def remaining_s(self) -> float:
        return self.deadline - time.monotonic()


class Dispatcher:
    def __init__(self, pool: WorkerPool, policy: Policy, metrics: RouterMetrics, max_attempts: int = 2,
                 failover: bool = False, tokenizer=None, page_size: int = 16):
        self.pool = pool
        self.policy = policy
        self.metrics = metrics
        self.max_attempts = max_attempts
        self.failover = failover and tokenizer is not None  # resume mid-stream (router/dispatch/failover.py)
        self.tokenizer = tokenizer
        self.page_size = page_size
        self._probes: set[asyncio.Task] = set()  # blame probes running after a request was answered
        pool.on_remove.append(policy.forget)
        pool.on_load.append(policy.load_changed)  # every load change: a share sent (WorkerPool.sent) or ended (done)

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
        PROBE_WAIT_S (and the deadline); after the last attempt not at all. The probes (up to 2 s on a
        hung worker) must not hold the answer past that; they finish in the background."""
        task = asyncio.get_running_loop().create_task(self._blame(p, d, error))
        self._probes.add(task)  # NOTE: a reference, or the task may be collected before it ends
        task.add_done_callback(self._probes.discard)
        if not final and job.remaining_s() > 0:
            await asyncio.wait((task,), timeout=min(job.remaining_s(), PROBE_WAIT_S))

    async def stream(self, job: Job) -> AsyncGenerator[list[worker_pb2.GenerateResponse], None]:
        """Yield D's chunks in batches (all that arrived together; the first batch holds the first
        token). Raises APIError before the first token, StreamFailed after it."""
        att = await self._open(job, None, set(), set())
        streamed: list[int] = []  # token ids the client has been sent (what a resumption continues)
        resumption: Resumption | None = None
        failovers = 0
        sequences = max(job.sampling.n, 1)
        ended = [0, sequences]  # n > 1: the call is over once every sequence ended
        try:
            batch = att.first
            while True:
                if resumption is not None:
                    batch = resumption.rewrite(batch)
                if batch:
                    # NOTE: the chunk with finish_reason is the last one: the request is complete
                    # here, and D's share of the load goes back before it is handed on.
                    if batch[-1].finish_reason if sequences == 1 else self._all_ended(batch, ended):
                        # NOTE: unless the router's own stop check ended a resumed stream before D did:
                        # then closing the attempt cancels D's call (D served it all the same).
                        att.close(served=True, cancel=resumption is not None and resumption.cut_short)
                    if self.failover:  # only a resumption reads them
                        for m in batch:
                            streamed.extend(m.token_ids)
                    yield batch
                    if att.closed:
                        return
                try:
                    batch = await att.call.next_batch()
                except RpcError as e:
                    self.pool.record_failure(att.d, f"{e.code().name}: {e.details()}")
                    self.metrics.worker_errors.labels(att.d.role, att.d.address).inc()
                    broke = (f"decode worker {att.d.address} failed mid-stream: {e.code().name}: {e.details()}")
                    if not self._may_resume(e, failovers, job):
                        if job.trace is not None:
                            job.trace.stream_failed(broke)
                        raise StreamFailed(broke) from None
                    failovers += 1
                    if job.trace is not None:
                        job.trace.failover(broke, len(streamed))
                    att.close()
                    resumption, att = await self._resume(job, streamed, att.d, failovers, broke)
                    batch = att.first
                    continue
                if not batch:
                    att.close(served=True, cancel=False)  # ended without a finish_reason: still a clean end
                    return
        finally:
            att.close()  # a client that went away (or a failure): stop the work on D and P

    @staticmethod
    def _all_ended(batch: list[worker_pb2.GenerateResponse], ended: list[int]) -> bool:
        """n > 1: count the sequences this batch ends (ended[1] = the request's n); all of them ended?"""
        ended[0] += sum(1 for m in batch if m.finish_reason)
        return ended[0] >= ended[1]

    def _may_resume(self, e: RpcError, failovers: int, job: Job) -> bool:
        # NOTE: only UNAVAILABLE (connection lost, worker gone): a worker that answered with an error
        # (INTERNAL, DEADLINE_EXCEEDED) would likely answer the same again.
        # NOTE: nor a request of n > 1 sequences (each would resume on its own: not served yet)
        return self.failover and e.code() == grpc.StatusCode.UNAVAILABLE and failovers < MAX_FAILOVERS \
            and job.sampling.n <= 1

    async def _resume(self, job: Job, streamed: list[int], dead: Worker, n: int,
                      broke: str) -> tuple[Resumption, _Attempt]:
        """Open the stream again on another D, continuing after `streamed`; StreamFailed if it cannot."""
        t0 = time.perf_counter()
        try:
            resumption = Resumption(self.tokenizer, job, streamed, self.page_size, n)
            log.warning("request %s: %s; resuming after %d tokens on another decode worker (%.1f s left)",
                        job.request_id, broke, len(streamed), job.remaining_s())
            att = await self._open(job, resumption, set(), {dead})
        except (APIError, ValueError) as e:
            self.metrics.failovers.labels("failed").inc()
            if job.trace is not None:
                job.trace.stream_failed(f"{broke}; resuming failed: {getattr(e, 'message', e)}")
            raise StreamFailed(f"{broke}; resuming on another decode worker failed: "
                               f"{getattr(e, 'message', e)}") from None
        self.metrics.failovers.labels("resumed").inc()
        self.metrics.failover_gap.observe(time.perf_counter() - t0)
        resumed = att.first
        cached = next((m.cached for m in resumed if m.HasField("cached")), None)
        if cached is not None:
            reused = {tier: getattr(cached, tier) for tier in CACHE_TIERS}
            for tier, tokens in reused.items():
                self.metrics.failover_cached_tokens.labels(tier).inc(tokens)
            computed = len(resumption.token_ids) - sum(reused.values())
            self.metrics.failover_computed_tokens.inc(computed)
        return resumption, att

    async def _open(self, job: Job, resumption: Resumption | None, tried_p: set, tried_d: set) -> _Attempt:
        """Open Generate on a P/D pair and wait for the first token, retrying once on another pair.
        `resumption` set: the request continues a broken stream (router/dispatch/failover.py)."""
        last_error: APIError | None = None
        hashes = job.page_hashes if resumption is None else resumption.page_hashes
        for attempt in range(self.max_attempts):
            remaining = job.remaining_s()
            if last_error is not None:  # a retry (attempt > 0)
                if remaining <= 0 or last_error.type == "timeout":
                    break  # NOTE: a retry never gets a fresh deadline (issue 14, hazard 3)
                self.metrics.retries.inc()
                if job.trace is not None:
                    job.trace.retry(last_error.message)
                log.warning("request %s failed before its first token (%s); retrying with %.1f s left",
                            job.request_id, last_error.message, remaining)
            elif remaining <= 0:
                raise _timeout(f"the request's deadline ({job.timeout_s:g} s) passed before it reached a worker")
            route = self.policy.route(self.pool, hashes, job.session, job.kv_tokens, tried_p, tried_d)
            p, d = route.p, route.d
            metadata = () if job.trace is None else \
                job.trace.attempt(p, d, self.policy.name, route.decision, route.prefills, resumption is not None)
            tried_p.add(p)
            tried_d.add(d)
            if resumption is None:
                req = worker_pb2.GenerateRequest(request_id=job.request_id, token_ids=job.token_ids,
                                                 sampling=job.sampling, prefill_address=p.address,
                                                 timeout_s=remaining)
            else:
                req = resumption.request(p.address, remaining)
            self.metrics.routed_to(p.role, p.address)
            self.metrics.routed_to(d.role, d.address)
            call: StreamCall | None = None
            try:
                calls = d.calls
                assert calls is not None  # a pooled worker has its channel (WorkerPool.upsert)
                call = await calls.call(GENERATE_PATH, req.SerializeToString(),
                                          worker_pb2.GenerateResponse.FromString, remaining, metadata)
                first = await _until_first_token(call)
            except BaseException as e:  # NOTE: also a client gone (cancelled) while waiting
                self.pool.done(p, ok=False)
                self.pool.done(d, ok=False)
                if call is not None:
                    call.cancel()  # stop the work on D and P
                if job.trace is not None:
                    job.trace.end_attempt(f"{e.code().name}: {e.details()}" if isinstance(e, RpcError)
                                          else type(e).__name__)
                if not isinstance(e, (RpcError, _EarlyEOF)):
                    raise
                final = attempt + 1 >= self.max_attempts
                last_error = await self._first_token_failure(e, p, d, job, final)
                continue
            # First token: prefill is done, P's share of the load ends here.
            self.pool.done(p, ok=True)
            return _Attempt(d, call, first, self.pool)
        assert last_error is not None
        raise last_error

    async def _first_token_failure(self, e: RpcError | _EarlyEOF, p: Worker, d: Worker, job: Job,
                                   final: bool) -> APIError:
        if isinstance(e, _EarlyEOF):
            msg = f"decode worker {d.address} ended the stream before the first token"
            await self._charge(p, d, msg, job, final)
            return upstream_error(msg)
        code, details = e.code(), e.details()
        if code in _CLIENT_CODES:
            param = job.grammar_param if job.grammar_param and "grammar:" in details else None
            raise bad_request(f"rejected by worker: {details}", param=param)
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


class _Attempt:
    """An open Generate stream on D past its first token; holds D's share of the load until closed."""

    def __init__(self, d: Worker, call: StreamCall, first: list[worker_pb2.GenerateResponse], pool: WorkerPool):
        self.d, self.call, self.first = d, call, first
        self._pool = pool
        self.closed = False

    def close(self, served: bool = False, cancel: bool = True) -> None:
        """D's share of the load back; `served`: D ended the request (a success for its circuit);
        `cancel`: D's call is cancelled (the stream did not end: a client gone, a failure)."""
        if self.closed:
            return
        self.closed = True
        self._pool.done(self.d, ok=served)
        if cancel:
            self.call.cancel()


async def _until_first_token(call: StreamCall) -> list[worker_pb2.GenerateResponse]:
    """The stream's messages up to the first that carries a token or a finish (_EarlyEOF: it ended)."""
    first: list[worker_pb2.GenerateResponse] = []
    while True:
        batch = await call.next_batch()
        if not batch:
            raise _EarlyEOF()
        first.extend(batch)
        if any(m.token_ids or m.finish_reason for m in batch):
            return first
