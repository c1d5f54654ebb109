"""The router's view of its workers: gRPC channels, load, health and circuit state.

Workers are keyed by (role, address). Discovery (static list or etcd watch) calls `upsert` /
`remove`; the health loop calls `Info` on every worker each `health_check_interval_s`.
A worker is *routable* when its last health check succeeded and its circuit allows a request.

Load is the number of requests this router has in flight on the worker (exact, updated on
every request); the health check's queued/running counts are kept in `info` for /workers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

import grpc

from pdorch.config import GrpcConfig
from pdorch.worker.rpc import CallerTokens, aio_channel, client_ssl_context
from proto.pdorch.v1 import worker_pb2, worker_pb2_grpc
from router.errors import unavailable
from router.fleet.circuit import CircuitBreaker
from router.fleet.layout import KVLayout
from router.grpc.stream import Channel

log = logging.getLogger("pdorch.router")

# NOTE: large prompts are thousands of int32 ids; keep gRPC's 4 MiB default out of the way.
_CHANNEL_OPTIONS = [("grpc.max_send_message_length", 64 << 20),
                    ("grpc.max_receive_message_length", 64 << 20),
                    ("grpc.keepalive_time_ms", 10_000),
                    ("grpc.http2.max_pings_without_data", 0),
                    # NOTE: per-call cost matters at thousands of calls/s (bench/router_overhead/).
                    # gRPC's retry layer buffers every call for a replay, but the dispatcher retries
                    # itself (on another P/D pair); the minimal stack drops optional filters
                    # (census, message-size checks; the 64 MiB limits above become moot).
                    # Deadlines, cancellation and keepalive are unaffected (tested).
                    ("grpc.enable_retries", 0),
                    ("grpc.minimal_stack", 1)]


class RoutableList(list):
    """`WorkerPool.routable`'s answer. `steady`: the pool's cached list of a role's healthy workers
    with a closed circuit, the same object until one of them changes (policies keep per-role state
    keyed on it instead of visiting every worker per request)."""

    __slots__ = ("steady",)

    def __init__(self, workers=(), steady: bool = False):
        super().__init__(workers)
        self.steady = steady


@dataclass(eq=False)
class Worker:
    role: str  # "prefill" | "decode"
    address: str  # gRPC host:port
    worker_id: str
    breaker: CircuitBreaker
    channel: grpc.aio.Channel | None = None  # Info / Flush / health checks
    stub: Any = None
    calls: Channel | None = None  # the Generate streams (router/grpc/stream.py: the hot path)
    healthy: bool = False
    checked: bool = False  # at least one health check finished
    info: worker_pb2.WorkerInfo | None = None
    in_flight: int = 0
    routed: int = 0
    kv_routed_mark: int = 0  # `routed` when its last KV event batch arrived (router/kv/watch.py)
    errors: int = 0
    last_error: str = ""
    meta: dict = field(default_factory=dict)  # discovery-provided info (etcd value)

    @property
    def load(self) -> int:
        return self.in_flight

    def routable(self, now: float) -> bool:
        return self.healthy and self.breaker.allow(now)

    def describe(self) -> dict:
        info = self.info
        return {
            "role": self.role, "address": self.address, "worker_id": self.worker_id,
            "healthy": self.healthy, "circuit": self.breaker.state, "in_flight": self.in_flight,
            "routed": self.routed, "errors": self.errors, "last_error": self.last_error,
            "info": None if info is None else {
                "model": info.model, "page_size": info.page_size, "total_pages": info.total_pages,
                "free_pages": info.free_pages, "queued_requests": info.queued_requests,
                "running_requests": info.running_requests, "store_enabled": info.store_enabled,
                "max_context_tokens": info.max_context_tokens, "kv_dtype": info.kv_dtype, "dtype": info.dtype,
                "model_family": info.model_family, "store_evicted_pages": info.store_evicted_pages,
                "preemptions": info.preemptions, "preempted_requests": info.preempted_requests,
                "tp_size": info.tp_size or 1},
        }


def pool_tokens(w: Worker) -> int:
    """Tokens of KV a worker's pool holds, as its Info reports (0: not reported)."""
    return w.info.total_pages * w.info.page_size if w.info else 0


class WorkerPool:
    """All known workers; mutated only on the event loop thread."""

    def __init__(self, failure_threshold: int, cooldown_s: float, health_interval_s: float,
                 rpc: GrpcConfig | None = None, layout: KVLayout | None = None):
        """`rpc`: the workers' shared token and TLS (config section `grpc`); every channel uses them.
        `layout`: the page size and KV dtype every worker must have (None: not checked)."""
        self.layout = layout
        self.failure_threshold = failure_threshold
        self.cooldown_s = cooldown_s
        self.health_interval_s = health_interval_s
        self.rpc = rpc or GrpcConfig()
        self._ssl = client_ssl_context(self.rpc)
        self.tokens = CallerTokens(self.rpc)  # which token each worker takes (a rotation: pdorch/worker/tokens.py)
        self._workers: dict[tuple[str, str], Worker] = {}
        # role -> (its healthy closed-circuit workers, its healthy others); rebuilt after a change
        self._routable: dict[str, tuple[RoutableList, list[Worker]]] = {}
        self._context_tokens: int | None = None  # the workers' smallest context; None: recount
        self._decode_pools: tuple[int, int] | None = None  # the decode workers' (smallest, largest) KV pool; None: recount
        self._health_task: asyncio.Task | None = None
        self.on_remove: list[Callable[[Worker], None]] = []  # callbacks(worker) (policies forget their index)
        # callbacks(worker) when a request's share of a worker's load ends (`done`; the policy keeps its loads)
        self.on_load: list[Callable[[Worker], None]] = []

    # ------------------------------------------------------------------ membership
    def upsert(self, role: str, address: str, worker_id: str = "", meta: dict | None = None) -> Worker:
        key = (role, address)
        w = self._workers.get(key)
        if w is None:
            stub_cls = worker_pb2_grpc.PrefillServiceStub if role == "prefill" else worker_pb2_grpc.DecodeServiceStub
            rpc = self.rpc
            channel = aio_channel(address, rpc, _CHANNEL_OPTIONS, self.tokens)
            calls = Channel(address, authorization=lambda: self.tokens.authorization(address), ssl_context=self._ssl,
                            server_hostname=rpc.tls_server_name)
            w = Worker(role, address, worker_id or address,
                       CircuitBreaker(self.failure_threshold, self.cooldown_s),
                       channel=channel, stub=stub_cls(channel), calls=calls, meta=meta or {})
            self._workers[key] = w
            self._routable.clear()
            self._context_tokens, self._decode_pools = None, None
            log.info("worker added: %s %s (%s)", role, address, w.worker_id)
            asyncio.get_running_loop().create_task(self.check(w))
        elif meta is not None:
            w.meta = meta
        return w

    async def remove(self, role: str, address: str) -> None:
        w = self._workers.pop((role, address), None)
        if w is None:
            return
        self._routable.clear()
        self._context_tokens, self._decode_pools = None, None
        log.info("worker removed: %s %s", role, address)
        for cb in self.on_remove:
            cb(w)
        if w.calls is not None:
            # NOTE: streams open on it go on: a draining decode worker leaves discovery first and
            # finishes (or hands on) its streams after; a dead one's break by themselves.
            w.calls.close(graceful=True)
        if w.channel is not None:
            await w.channel.close(grace=None)

    def workers(self, role: str | None = None) -> list[Worker]:
        return [w for w in self._workers.values() if role is None or w.role == role]

    def context_tokens(self) -> int:
        """The smallest context any worker reported in its Info (0: none has). NOTE: kept, not
        counted per request: at 1,000 workers the pass cost ~80 µs, twice the routing decision."""
        if self._context_tokens is None:
            limits = [w.info.max_context_tokens for w in self._workers.values() if w.info and w.info.max_context_tokens]
            self._context_tokens = min(limits, default=0)
        return self._context_tokens

    def decode_pool_tokens(self) -> int:
        """Tokens the LARGEST decode worker's KV pool holds (total pages x page size; 0: none has
        reported): a request whose prompt + max_tokens exceeds it could never be held whole by any
        decode worker (one that fits only the larger pools goes to those: decode_fits). Kept as
        context_tokens() is."""
        return self._pools()[1]

    def decode_fits(self, workers: list[Worker], kv_tokens: int) -> list[Worker]:
        """`workers` whose KV pool holds `kv_tokens` (those that have not reported count as holding
        it: the worker checks again). The same list when the smallest pool holds it (the steady
        case: the policy's per-list state stays valid)."""
        if kv_tokens <= self._pools()[0]:
            return workers
        return [w for w in workers if not (w.info and w.info.total_pages) or pool_tokens(w) >= kv_tokens]

    def _pools(self) -> tuple[int, int]:
        if self._decode_pools is None:
            pools = [pool_tokens(w) for w in self._workers.values() if w.role == "decode" and w.info and w.info.total_pages]
            self._decode_pools = (min(pools, default=0), max(pools, default=0))
        return self._decode_pools

    def routable(self, role: str, exclude: AbstractSet[Worker] = frozenset()) -> RoutableList:
        """The role's workers a request may go to now, in the pool's order. NOTE: with every healthy
        worker's circuit closed (the steady state) this is one cached list, not a pass over the
        workers: at 1,000 workers that pass cost more than the routing decision. Callers must not
        modify it."""
        cached = self._routable.get(role)
        if cached is None:
            mine = [w for w in self._workers.values() if w.role == role and w.healthy]
            cached = self._routable[role] = (RoutableList((w for w in mine if w.breaker.state == "closed"), steady=True),
                                             [w for w in mine if w.breaker.state != "closed"])
        out, others = cached
        if others:
            now = time.monotonic()
            if any(w.breaker.allow(now) for w in others):  # a circuit past its cooldown: a trial may go
                out = RoutableList(w for w in self._workers.values() if w.role == role and w.routable(now))
        if exclude:
            out = RoutableList(w for w in out if w not in exclude)
        return out

    def candidates(self, tried_p: AbstractSet[Worker], tried_d: AbstractSet[Worker],
                   kv_tokens: int) -> tuple[RoutableList, list[Worker]]:
        """(the prefill workers, the decode workers) a request may go to now: those not tried yet where
        others are routable, and the decode workers whose KV pool holds `kv_tokens` where any does.
        503 (Retry-After: one health-check interval) when a role has none."""
        prefills = self.routable("prefill", tried_p) or self.routable("prefill")
        decodes = self.routable("decode", tried_d) or self.routable("decode")
        if not prefills or not decodes:
            missing = " and ".join(r for r, ws in (("prefill", prefills), ("decode", decodes)) if not ws)
            raise unavailable(f"no healthy {missing} worker is available; retry later",
                              max(1, int(self.health_interval_s)))
        # NOTE: a request only the larger decode pools hold goes to one of those
        fits = self.decode_fits(decodes, kv_tokens) or self.decode_fits(self.routable("decode"), kv_tokens)
        if not fits:
            raise unavailable(f"no healthy decode worker whose KV pool holds the request's {kv_tokens} tokens "
                              "(prompt + output) is available; retry later")
        return prefills, fits

    def _set_healthy(self, w: Worker, healthy: bool) -> None:
        if w.healthy != healthy:
            w.healthy = healthy
            self._routable.clear()

    # ------------------------------------------------------------------ load
    def sent(self, p: Worker, d: Worker) -> None:
        """A request goes out to P and D: each one's load and routed count, its circuit told, `on_load`
        told (as `done` tells it: every load change reaches the policy one way)."""
        for w in (p, d):
            w.in_flight += 1
            w.routed += 1
            w.breaker.on_sent()
            for cb in self.on_load:
                cb(w)

    def done(self, w: Worker, ok: bool) -> None:
        """The request's share of `w`'s load ends (P at the first token, D at the stream's end, both
        on a failed attempt); `ok`: the worker served it (a circuit on trial closes)."""
        w.in_flight -= 1
        for cb in self.on_load:
            cb(w)
        if ok:
            self.record_success(w)

    # ------------------------------------------------------------------ outcomes
    def record_success(self, w: Worker) -> None:
        if w.breaker.state != "closed":
            self._routable.clear()
        w.breaker.record_success()

    def record_failure(self, w: Worker, error: str) -> None:
        w.errors += 1
        w.last_error = error
        state = w.breaker.state
        w.breaker.record_failure(time.monotonic())
        if w.breaker.state != state:
            self._routable.clear()

    # ------------------------------------------------------------------ health
    async def check(self, w: Worker) -> bool:
        # NOTE: the deadline has a 1 s floor even with a shorter interval: the first Info on a new
        # channel includes the connection set-up, which took > 0.3 s on a loaded 2-core machine and
        # marked the only worker unhealthy. A dead process still fails at once (UNAVAILABLE); the
        # floor only delays noticing a hung one.
        timeout = max(1.0, min(2.0, self.health_interval_s))
        try:
            info = await w.stub.Info(worker_pb2.InfoRequest(), timeout=timeout)
            if w.info is None or w.info.max_context_tokens != info.max_context_tokens:
                self._context_tokens = None
            if w.info is None or w.info.total_pages != info.total_pages or w.info.page_size != info.page_size:
                self._decode_pools = None
            w.info = info
            refusal = self.layout.refusal(w.info) if self.layout is not None else None
            if refusal is not None:
                if w.last_error != f"refused: {refusal}":
                    log.error("worker refused: %s %s: %s", w.role, w.address, refusal)
                self._set_healthy(w, False)
                w.checked, w.last_error = True, f"refused: {refusal}"
                return False
            if not w.healthy:
                log.info("worker healthy: %s %s", w.role, w.address)
            self._set_healthy(w, True)
            if w.breaker.state != "closed" and w.breaker.allow(time.monotonic()):
                self.record_success(w)  # reachable again after the cooldown
        except grpc.aio.AioRpcError as e:
            if w.healthy or not w.checked:
                log.warning("worker unhealthy: %s %s: %s", w.role, w.address, e.code().name)
            self._set_healthy(w, False)
            w.last_error = f"health check: {e.code().name}: {e.details()}"
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this task is being cancelled (the pool closes)
            # NOTE: the call was cancelled under it: the worker left and `remove` closed its channel.
            # Raised on, it ended the whole health loop (gather) and no worker was checked again.
            self._set_healthy(w, False)
            w.last_error = "health check: the worker's channel closed (it left)"
        except Exception as e:  # noqa: BLE001 - a broken channel must not kill the health loop
            self._set_healthy(w, False)
            w.last_error = f"health check: {e!r}"
        w.checked = True
        return w.healthy

    async def check_all(self) -> None:
        ws = list(self._workers.values())
        if ws:
            await asyncio.gather(*(self.check(w) for w in ws))

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            await self.check_all()

    def start(self) -> None:
        if self._health_task is None:
            self._health_task = asyncio.get_running_loop().create_task(self._health_loop())

    async def close(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            try:
                await self._health_task
            except asyncio.CancelledError:
                pass
            self._health_task = None
        for w in list(self._workers.values()):
            await self.remove(w.role, w.address)
