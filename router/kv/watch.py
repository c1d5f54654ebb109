"""KVWatcher: the router's subscriptions to every worker's KV events (`WatchKV`), applied to its KVIndex.

One task per known worker (prefill and decode), on the router's event loop, following the pool's
membership (a reconcile every `reconcile_s`: new workers are subscribed, removed ones dropped from
the index). Each task:

    subscribe(epoch, after_seq = the index's resume point)   -> a snapshot, or the batches after it
    every batch -> index.apply(address, batch)
        "snapshot" / "applied"   the stream is live
        "gap"                    resubscribe at once with the resume point (the worker answers with
                                 the missed batches, or a snapshot: a new epoch, a seq too old)
    no batch within `stale_after_s` (the worker sends a heartbeat batch every second), the stream
    ending, an error                -> the worker is stale (the policy falls back to the routing-time
                                       guess for it), resubscribe after a backoff (0.2 s doubling to 5 s)
    FAILED_PRECONDITION (the worker refuses the hash scheme, page size or layout)  -> logged with
                                       the worker's reason, retried slowly (30 s): routing stays on the guess
    UNIMPLEMENTED (a worker older than WatchKV)   -> not followed again; the guess serves it

Why on the event loop, not a thread: applying a batch is a few dict operations per page, and the
index is read by the policy on the same loop, so it needs no lock. Counters are plain numbers the
metrics collector reads at scrape time.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass, field

import grpc
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from proto.pdorch.v1 import worker_pb2
from router.fleet.workers import Worker, WorkerPool
from router.kv.index import KVIndex
from store_client.page_hash import HASH_SCHEME, KV_LAYOUT_VERSION

log = logging.getLogger("pdorch.router.kv.watch")

_BACKOFF_S, _BACKOFF_MAX_S, _REFUSED_RETRY_S = 0.2, 5.0, 30.0
STOP_TIMEOUT_S = 5.0  # stop(): how long the cancelled watch tasks get to end


@dataclass
class StreamState:
    """What the router knows of one worker's event stream (pdorch status, metrics)."""

    state: str = "connecting"  # connecting | live | stale | refused | unsupported
    received: int = 0  # batches received
    applied: int = 0  # batches applied (snapshots included)
    snapshots: int = 0
    resyncs: int = 0  # gaps that made the router resubscribe
    disconnects: int = 0
    last_error: str = ""
    outcomes: Counter = field(default_factory=Counter)

    def describe(self) -> dict:
        return {"state": self.state, "received": self.received, "applied": self.applied,
                "snapshots": self.snapshots, "resyncs": self.resyncs, "disconnects": self.disconnects,
                "last_error": self.last_error}


class KVWatcher:
    def __init__(self, pool: WorkerPool, index: KVIndex, page_size: int, name: str = "router",
                 stale_after_s: float = 3.0, reconcile_s: float = 0.5):
        self.pool, self.index, self.page_size, self.name = pool, index, page_size, name
        self.stale_after_s, self.reconcile_s = stale_after_s, reconcile_s
        self.streams: dict[str, StreamState] = {}
        self.on_load_changed = lambda worker: None  # the policy's: a batch moved the worker's published load
        self._tasks: dict[str, asyncio.Task] = {}
        self._reconciler: asyncio.Task | None = None

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self._reconcile()
        self._reconciler = asyncio.get_running_loop().create_task(self._reconcile_loop())

    async def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        tasks = [t for t in [self._reconciler, *self._tasks.values()] if t is not None]
        for t in tasks:
            t.cancel()
        if tasks:
            _, left = await asyncio.wait(tasks, timeout=timeout_s)
            if left:  # a shutdown goes on without them (the event loop's end cancels them again)
                log.error("KV watch: %d task(s) did not end within %.0f s of their cancel: %s", len(left),
                          timeout_s, ", ".join(t.get_name() for t in left))
        self._tasks.clear()
        self._reconciler = None

    async def _reconcile_loop(self) -> None:
        while True:
            await asyncio.sleep(self.reconcile_s)
            self._reconcile()

    def _reconcile(self) -> None:
        known = {w.address: w for w in self.pool.workers()}
        for address in [a for a in self._tasks if a not in known]:
            self._tasks.pop(address).cancel()
            self.streams.pop(address, None)
            self.index.drop_worker(address)
        loop = asyncio.get_running_loop()
        for address, w in known.items():
            if address not in self._tasks:
                self.streams[address] = StreamState()
                self._tasks[address] = loop.create_task(self._follow(w), name=f"kv-watch {address}")

    # ------------------------------------------------------------------ one worker's stream
    async def _follow(self, w: Worker) -> None:
        st, backoff = self.streams[w.address], _BACKOFF_S
        while True:
            outcome = await self._subscribe_once(w, st)
            self.index.set_live(w.address, False)
            if outcome == "unsupported":
                return
            if outcome == "gap":  # resubscribe at once: the worker replays or sends a snapshot
                continue
            if outcome == "refused":
                await asyncio.sleep(_REFUSED_RETRY_S)
                continue
            if st.state == "live":
                backoff = _BACKOFF_S  # it was up: reconnect quickly
            st.state = "stale"
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _BACKOFF_MAX_S)

    async def _subscribe_once(self, w: Worker, st: StreamState) -> str:
        """One subscription until it ends; returns why: gap | ended | refused | unsupported."""
        epoch, seq = self.index.resume_point(w.address)
        request = worker_pb2.WatchKVRequest(hash_scheme=HASH_SCHEME, page_size=self.page_size,
                                            layout_version=KV_LAYOUT_VERSION, epoch=epoch, after_seq=seq,
                                            subscriber=self.name)
        call = w.stub.WatchKV(request)
        batches = call.__aiter__()  # NOTE: not call.read(): the token interceptor's call wraps the iterator
        try:
            while True:
                try:
                    # NOTE: asyncio.timeout, not asyncio.wait_for: on Python 3.11 wait_for returns a batch that
                    # arrived in the same loop pass as a cancel and drops the cancel, and this loop then
                    # went on for ever (stop() never returned: a router's shutdown hung)
                    async with asyncio.timeout(self.stale_after_s):
                        batch = await batches.__anext__()
                except StopAsyncIteration:
                    st.disconnects += 1
                    return "ended"
                st.received += 1
                outcome = self.index.apply(w.address, batch)
                st.outcomes[outcome] += 1
                if outcome == "gap":
                    st.resyncs += 1
                    return "gap"
                st.applied += outcome != "duplicate"  # a batch already applied (a replay's overlap)
                w.kv_routed_mark = w.routed  # its load numbers now include what this router sent so far
                self.on_load_changed(w)
                st.snapshots += outcome == "snapshot"
                if st.state != "live":
                    log.info("KV events of %s %s: live (epoch %s, seq %d)", w.role, w.address, batch.epoch, batch.seq)
                st.state = "live"
                self.index.set_live(w.address, True)
        except TimeoutError:
            st.disconnects += 1
            st.last_error = f"no KV event batch within {self.stale_after_s:g} s"
            return "ended"
        except grpc.aio.AioRpcError as e:
            st.last_error = f"{e.code().name}: {e.details()}"
            if e.code() == grpc.StatusCode.FAILED_PRECONDITION:
                if st.state != "refused":
                    log.error("KV events of %s %s refused: %s", w.role, w.address, e.details())
                st.state = "refused"
                return "refused"
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                log.warning("KV events: %s %s has no WatchKV; routing to it stays on the guess", w.role, w.address)
                st.state = "unsupported"
                return "unsupported"
            st.disconnects += 1
            return "ended"
        finally:
            call.cancel()

    # ------------------------------------------------------------------ observability
    def describe(self, address: str) -> dict | None:
        st = self.streams.get(address)
        if st is None:
            return None
        # the load as the worker last published it (queued + running requests; None before a batch)
        return st.describe() | {"published_load": self.index.load(address)}

    def collect(self):
        """Metric families, read at scrape time (router/metrics.py)."""
        fams = {
            "received": CounterMetricFamily("pdorch_router_kv_event_batches_received", "KV event batches "
                                            "received per worker", labels=("worker",)),
            "applied": CounterMetricFamily("pdorch_router_kv_event_batches_applied", "KV event batches applied "
                                           "to the index per worker (snapshots included)", labels=("worker",)),
            "snapshots": CounterMetricFamily("pdorch_router_kv_event_snapshots", "Snapshots applied per worker "
                                             "(subscribe, new epoch, resync)", labels=("worker",)),
            "resyncs": CounterMetricFamily("pdorch_router_kv_event_resyncs", "Gaps in a worker's stream that "
                                           "made the router resubscribe", labels=("worker",)),
            "disconnects": CounterMetricFamily("pdorch_router_kv_event_disconnects", "Streams ended or silent "
                                               "past router.kv_stale_after_s", labels=("worker",)),
        }
        live = GaugeMetricFamily("pdorch_router_kv_event_stream_live", "1 while a worker's KV event stream is "
                                 "live (0: stale, the policy uses the routing-time guess for it)", labels=("worker",))
        for address, st in self.streams.items():
            for key, fam in fams.items():
                fam.add_metric((address,), getattr(st, key))
            live.add_metric((address,), 1.0 if st.state == "live" else 0.0)
        yield from fams.values()
        yield live


def kv_index_metrics(index: KVIndex):
    """The index's size and memory as metric families, read at scrape time."""
    def collect():
        stats = index.stats()
        pages = GaugeMetricFamily("pdorch_router_kv_index_pages", "Pages the router's KV index holds, per "
                                  "worker's prefix cache (worker) and for the store (worker=\"store\")",
                                  labels=("worker",))
        for address, n in stats.get("l1_pages", {}).items():
            pages.add_metric((address,), n)
        pages.add_metric(("store",), stats.get("store_pages", 0))
        yield pages
        yield GaugeMetricFamily("pdorch_router_kv_index_bytes", "Estimated memory of the router's KV index",
                                value=stats.get("memory_bytes", 0))
        spec = CounterMetricFamily("pdorch_router_kv_speculative_pages", "Routing-time guesses (pages counted in "
                                   "the chosen worker's cache before its events said so), by outcome",
                                   labels=("outcome",))
        for outcome in ("confirmed", "expired"):
            spec.add_metric((outcome,), stats.get(f"speculative_{outcome}", 0))
        yield spec
        yield GaugeMetricFamily("pdorch_router_kv_speculative_live_pages", "Routing-time guesses not yet "
                                "confirmed or expired", value=stats.get("speculative_live", 0))
    return collect
