"""Where the router's workers come from: a static list, or an etcd prefix watch.

etcd layout (written by pdorch/worker/registration.py on each worker):
    /{cluster}/workers/{role}/{worker_id} -> {"address": "host:port", "info": {...}}

The etcd watcher lists the prefix once, then watches from the next revision, so no event is
lost between the two. python3-etcd3 is synchronous: the list runs in a thread and watch
events arrive on etcd3's thread; both are handed to the event loop with
`call_soon_threadsafe`, so the WorkerPool is only touched on the loop. A watch error (etcd
down, compaction) triggers a full resync after a short delay.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import store_client.etcd_compat  # noqa: F401  (mends etcd3's watch thread)
from pdorch.config import DiscoveryConfig
from pdorch.worker.registration import connect, workers_prefix
from router.fleet.workers import WorkerPool

log = logging.getLogger("pdorch.router")

class StaticDiscovery:
    def __init__(self, cfg: DiscoveryConfig, pool: WorkerPool):
        self.cfg = cfg
        self.pool = pool

    async def start(self) -> None:
        for role, addrs in (("prefill", self.cfg.prefill), ("decode", self.cfg.decode)):
            for a in addrs:
                self.pool.upsert(role, a)

    async def stop(self) -> None:
        pass


def parse_entry(key: str, value: bytes, prefix: str) -> tuple[str, str, str, dict] | None:
    """(role, worker_id, address, info) of one registration, or None if malformed."""
    rest = key[len(prefix):].split("/")
    if len(rest) != 2 or rest[0] not in ("prefill", "decode"):
        return None
    try:
        v = json.loads(value)
        address = v["address"]
    except (ValueError, KeyError, TypeError):
        log.warning("ignoring malformed registration %s", key)
        return None
    return rest[0], rest[1], address, v.get("info") or {}


class EtcdDiscovery:
    RESYNC_DELAY_S = 1.0

    def __init__(self, cfg: DiscoveryConfig, pool: WorkerPool):
        self.cfg = cfg
        self.pool = pool
        self.prefix = workers_prefix(cfg.cluster)
        self._client: Any = None  # etcd3's client (untyped); set by start()
        self._watch_id: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._entries: dict[str, tuple[str, str]] = {}  # key -> (role, address)
        self._resync_task: asyncio.Task | None = None
        self._stopped = False

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self._sync()

    def _started_loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "Discovery.start() sets the loop before any watch runs"
        return self._loop

    async def _sync(self) -> None:
        """List the prefix, reconcile the pool with it, watch from the next revision."""
        if self._client is None:
            self._client = await asyncio.to_thread(connect, self.cfg.etcd_endpoints)
        kvs, revision = await asyncio.to_thread(self._list)
        seen = {}
        for key, value in kvs:
            e = parse_entry(key, value, self.prefix)
            if e is not None:
                seen[key] = e
        for key in list(self._entries):
            if key not in seen:
                await self._remove(key)
        for key, e in seen.items():
            self._put(key, e)
        self._watch_id = await asyncio.to_thread(
            self._client.add_watch_prefix_callback, self.prefix, self._on_watch, start_revision=revision + 1)

    def _list(self):
        import etcd3.etcdrpc as rpc
        from etcd3 import utils

        c = self._client
        p = self.prefix.encode()
        req = rpc.RangeRequest(key=p, range_end=utils.prefix_range_end(p))
        resp = c.kvstub.Range(req, c.timeout, credentials=c.call_credentials, metadata=c.metadata)
        return [(kv.key.decode(), kv.value) for kv in resp.kvs], resp.header.revision

    def _put(self, key: str, e: tuple[str, str, str, dict]) -> None:
        role, worker_id, address, info = e
        old = self._entries.get(key)
        if old is not None and old != (role, address):
            self._started_loop().create_task(self.pool.remove(*old))
        self._entries[key] = (role, address)
        self.pool.upsert(role, address, worker_id, meta=info)

    async def _remove(self, key: str) -> None:
        old = self._entries.pop(key, None)
        if old is not None and old not in self._entries.values():
            await self.pool.remove(*old)

    # -------------------------------------------------------------- etcd3's thread -> loop
    def _on_watch(self, resp) -> None:
        if self._stopped:
            return
        self._started_loop().call_soon_threadsafe(self._apply, resp)

    def _apply(self, resp) -> None:
        import etcd3.events as ev

        if resp is None or isinstance(resp, Exception):  # None: the watch stream ended
            log.warning("etcd watch ended (%s); resyncing", resp or "stream closed")
            self._schedule_resync()
            return
        for event in resp.events:
            key = event.key.decode()
            if isinstance(event, ev.PutEvent):
                e = parse_entry(key, event.value, self.prefix)
                if e is not None:
                    self._put(key, e)
            elif isinstance(event, ev.DeleteEvent):
                self._started_loop().create_task(self._remove(key))

    def _schedule_resync(self) -> None:
        if self._resync_task is None or self._resync_task.done():
            self._resync_task = self._started_loop().create_task(self._resync())

    async def _resync(self) -> None:
        failures = 0
        while not self._stopped:
            await asyncio.sleep(self.RESYNC_DELAY_S)
            try:
                if self._watch_id is not None:
                    await asyncio.to_thread(self._client.cancel_watch, self._watch_id)
                    self._watch_id = None
                if failures and len(self.cfg.etcd_endpoints) > 1:  # NOTE: the member it used may be gone
                    await self._move_to_another_endpoint()
                await self._sync()
                if failures:
                    log.warning("etcd is back after %d failed resyncs; %d workers registered", failures,
                                len(self._entries))
                return
            except Exception as e:  # noqa: BLE001 - etcd still down: try again
                failures += 1
                # The pool is left as it is: workers do not die with etcd, so keep routing to them
                # (health checks still take dead ones out). Said once per outage, not every second.
                (log.warning if failures == 1 else log.debug)(
                    "etcd unreachable (%s); routing to the %d last known workers until it is back; "
                    "retrying every %.0f s", e, len(self._entries), self.RESYNC_DELAY_S)

    async def _move_to_another_endpoint(self) -> None:
        old = self._client
        self._client = await asyncio.to_thread(connect, self.cfg.etcd_endpoints, 5.0, getattr(old, "endpoint", None))
        self._watch_id = None
        if old is not None:
            await asyncio.to_thread(old.close)
        log.warning("etcd: now through %s", self._client.endpoint)

    async def stop(self) -> None:
        self._stopped = True
        if self._resync_task is not None:
            self._resync_task.cancel()
        if self._client is not None:
            if self._watch_id is not None:
                try:
                    await asyncio.to_thread(self._client.cancel_watch, self._watch_id)
                except Exception as e:  # noqa: BLE001 - closing anyway
                    log.debug("cancel_watch on stop: %s", e)
            await asyncio.to_thread(self._client.close)
            self._client = None


def make_discovery(cfg: DiscoveryConfig, pool: WorkerPool):
    return EtcdDiscovery(cfg, pool) if cfg.mode == "etcd" else StaticDiscovery(cfg, pool)
