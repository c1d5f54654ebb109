"""KVStore: the Mooncake store as the L3 KV tier, batched and zero-copy, never raising to the caller.

    match_prefix(keys) -> n          one batch_is_exist; leading present pages
    present(keys) -> (bool, ...)     one batch_is_exist; per page (the decode worker's plan)
    load(keys, addrs)  -> LoadResult one batch_get_into straight into pool pages (with the SSD tier
                                     on, one batch_get_replica_desc beside it: which pages come from disk)
    load_many([(keys, addrs), ...])  several requests' loads in one batch_get_into
    save(keys, addrs)  -> SaveResult one batch_is_exist + one batch_put_from of the absent keys

A page is `objects.groups` store objects, one per group of KV heads (page_objects.py): this class
speaks pages to its callers and objects to Mooncake, and a page counts as read, present or written
only when every object of it this worker holds is.

A load is its own existence check: a missing key fails only its own entry (-704), so one
batch_get_into over every page a request could reuse loads all present pages, and a missing page
costs only itself (the caller recomputes just that page: its key, and every later page's key, is a
hash of token ids, not of KV). No separate batch_is_exist on the read path: it would take a read
lease on every key of the conversation and block their eviction. Misses are counted by reason
(see metrics.py); pages present after a missing one are counted as `hole` reads.

Connection lifecycle (a connector thread owns it; the serving path never waits for it):

    disabled --probe ok + setup--> connected --(-900 / health_check != 0)--> lost
        ^  probe fails: retry every              ^                               |
        |  reconnect_interval_s                  +---- health ok + probe op ok --+

NOTE: `MooncakeDistributedStore.setup` holds the GIL and retries ~90 s when the master is down,
which would freeze every thread of the worker. So we only call it after a cheap TCP/HTTP probe
has seen the master and metadata server answer. Once set up, the client re-connects by itself
when a master restarts on the same address (and re-mounts its segment); we watch `health_check()`.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from store_client.config import StoreConfig
from store_client.connector import StoreConnector
from store_client.metrics import StoreMetrics
from store_client.page_codes import (
    _chunks,
    _distinct_key_batches,
    _first_not,
    _page_remove,
    _page_save,
)
from store_client.page_objects import PageObjects
from store_client.recent_writes import RecentWrites
from store_client.replica_tier import disk_only_keys
from store_client.results import (
    _NO_SPACE,
    _RPC_FAILED,
    ABSENT,
    DISABLED,
    OK,
    SIZE_MISMATCH,
    TRANSFER_FAILED,
    LoadResult,
    SaveResult,
    check_pairs,
    classify,
)

log = logging.getLogger(__name__)

# The SSD tier: a write DRAM refused is retried this often, this far apart (about one offload heartbeat).
SSD_NO_SPACE_RETRIES = 4
SSD_NO_SPACE_RETRY_S = 0.25

class KVStore:
    """Thread-safe; called from StoreIO's I/O threads (or directly by tests and benchmarks)."""

    def __init__(self, cfg: StoreConfig, page_nbytes: int, metrics: StoreMetrics, component: str = "",
                 objects: PageObjects | None = None):
        if page_nbytes <= 0:
            raise ValueError(f"page_nbytes must be > 0, got {page_nbytes}")
        self.objects = objects or PageObjects.whole_page(page_nbytes)
        if self.objects.page_nbytes != page_nbytes:
            raise ValueError(f"page_nbytes {page_nbytes} is not the {len(self.objects.held)} objects of "
                             f"{self.objects.group_nbytes} bytes this page holds")
        self.cfg = cfg
        self.page_nbytes = page_nbytes
        self.metrics = metrics
        # component: names this worker's own SSD directory (cfg.ssd_dir) when the SSD tier is on.
        self._connector = StoreConnector(cfg, self.metrics, component)
        # Called with the number of pages a save is about to put (the chain evictor makes room).
        self.before_write: Callable[[int], object] | None = None
        # HA masters: the pages written lately, audited after a leader switch; the pages the new leader
        # lacks go to on_lost (the worker writes again those it holds; recent_writes.py).
        self.recent = RecentWrites(cfg.audit_window_s, cfg.audit_max_pages, self.objects)
        self.on_lost: Callable[[list[str]], None] | None = None
        self._connector.audit = self._audit_recent_writes
        # The SSD tier's replica lookup runs on its own thread, beside the read it attributes: under a
        # CPU-bound scheduler loop each return from Mooncake waits up to one GIL switch interval (5 ms),
        # so a lookup before the read put that wait, ~8 ms measured, on every batch's critical path.
        self._tier_lookup = (ThreadPoolExecutor(1, thread_name_prefix="store-tier")
                             if self._connector.ssd_dir else None)
        if cfg.enabled:
            self._connector.start()
        else:
            log.warning("store DISABLED by config (store.enabled=false): no L3 KV tier")

    @property
    def ssd_dir(self) -> str:
        """This worker's SSD tier directory ("" when DRAM only)."""
        return self._connector.ssd_dir

    @property
    def master_leader(self) -> str | None:
        """HA masters: the leading master as the connector last read it from etcd (each second)."""
        return self._connector.leader

    def raw_client(self):
        """The Mooncake client while connected, else None (metrics only; ops go through KVStore)."""
        return self._connector.client()

    @property
    def enabled(self) -> bool:
        """True while connected and healthy. Cheap; read it before submitting I/O."""
        return self._connector.client() is not None

    def wait_enabled(self, timeout_s: float) -> bool:
        """Block until connected (start-up, tests, benchmarks); never call it on the serving path."""
        return self._connector.wait_connected(timeout_s)

    def register_buffer(self, ptr: int, nbytes: int) -> None:
        """Register pool memory (zero copy; required for RDMA). Re-registered on every reconnect."""
        if ptr <= 0 or nbytes <= 0:
            raise ValueError(f"register_buffer needs ptr > 0 and nbytes > 0, got ptr={ptr:#x} nbytes={nbytes}")
        self._connector.add_buffer(ptr, nbytes)

    # ------------------------------------------------------------------ operations
    def match_prefix(self, keys: Sequence[str]) -> int:
        """Number of leading keys present in the store (0 on any failure)."""
        present = self.present(keys)
        return present.index(False) if False in present else len(present)

    def present(self, keys: Sequence[str]) -> tuple[bool, ...]:
        """Per key: present in the store (False on any failure). One batch_is_exist.

        NOTE: it grants a read lease on every key found (blocks their eviction for
        default_kv_lease_ttl): ask only for pages that are about to be read."""
        if not keys:
            return ()
        client = self._connector.client()
        if client is None:
            self._miss("match", len(keys), DISABLED)
            return (False,) * len(keys)
        t0 = time.perf_counter()
        objects = self.objects.keys(keys)
        try:
            codes = list(client.batch_is_exist(objects))
        except Exception as e:  # noqa: BLE001 - a store fault must never reach the request
            codes = [_RPC_FAILED] * len(objects)
            log.warning("batch_is_exist raised: %s", e)
        if len(codes) != len(objects):  # defensive, as in load_many
            codes = codes + [_RPC_FAILED] * (len(objects) - len(codes))
        elapsed = self._observe("match", t0, codes)
        codes = self.objects.fold(codes, len(self.objects.held), _first_not(1))
        found = tuple(c == 1 for c in codes)
        self.metrics.hits.labels("match").inc(sum(found))
        misses = [ABSENT if c == 0 else classify(c, elapsed, self._deadline) for c in codes if c != 1]
        for why, count in collections.Counter(misses).items():
            self._miss("match", count, why)
        return found

    def load(self, keys: Sequence[str], addrs: Sequence[int]) -> LoadResult:
        """Read pages into pool addresses; pages after the first failure count as misses."""
        return self.load_many([(keys, addrs)])[0]

    def load_many(self, requests: Sequence[tuple[Sequence[str], Sequence[int]]]) -> list[LoadResult]:
        """Several requests' loads in ONE batch_get_into; each request keeps its own prefix rule."""
        for keys, addrs in requests:
            check_pairs(keys, addrs)
        total = sum(len(keys) for keys, _ in requests)
        if total == 0:
            return [LoadResult(0, OK) for _ in requests]
        client = self._connector.client()
        if client is None:
            self._miss("load", total, DISABLED)
            return [LoadResult(0, DISABLED if keys else OK, (False,) * len(keys)) for keys, _ in requests]
        all_keys = self.objects.keys([k for keys, _ in requests for k in keys])
        all_addrs = self.objects.addrs([a for _, addrs in requests for a in addrs])
        t0 = time.perf_counter()
        lookup = self._submit_lookup(client, all_keys)
        codes = [_RPC_FAILED] * len(all_keys)
        for batch in _distinct_key_batches(all_keys):
            got = self._get_into(client, [all_keys[i] for i in batch], [all_addrs[i] for i in batch])
            for i, code in zip(batch, got):
                codes[i] = code
        elapsed = self._observe("load", t0, codes)
        per, size = len(self.objects.held), self.objects.group_nbytes
        # a page is read when each of its objects gave exactly its bytes; from disk when any did
        codes = self.objects.fold(codes, per, _first_not(size, whole=self.page_nbytes))
        on_disk = [any(d) for d in _chunks(self._lookup_result(lookup, len(all_keys), t0), per)]
        results, off = [], 0
        for keys, _ in requests:
            results.append(self._load_result(codes[off:off + len(keys)], elapsed, on_disk[off:off + len(keys)]))
            off += len(keys)
        return results

    def _submit_lookup(self, client, keys: list[str]):
        """The tier lookup's future, or None when the SSD tier is off or the store is closing."""
        if self._tier_lookup is None:
            return None
        try:
            return self._tier_lookup.submit(disk_only_keys, client, keys)
        except RuntimeError:  # shut down by close(): this read goes unattributed
            return None

    def _lookup_result(self, lookup, n: int, t0: float) -> list[bool]:
        """The tier lookup's answer (one master RPC, done before the read is, as a rule); all False
        when the SSD tier is off or the lookup missed the op deadline (attribution only)."""
        if lookup is None:
            return [False] * n
        try:  # NOTE: returns at once as a rule: the lookup is one ~2 ms RPC, the read tens of ms
            return lookup.result(timeout=max(0.0, self._deadline - (time.perf_counter() - t0)))
        except Exception as e:  # noqa: BLE001 - a timeout, or the pool shut down by close()
            log.warning("replica lookup for %d pages gave no answer: %r", n, e)
            return [False] * n

    def _get_into(self, client, keys: list[str], addrs: list[int]) -> list[int]:
        try:
            codes = list(client.batch_get_into(keys, addrs, [self.objects.group_nbytes] * len(keys)))
        except Exception as e:  # noqa: BLE001
            codes = []
            log.warning("batch_get_into raised: %s", e)
        # defensive: a short answer is a failure of the missing entries
        return codes + [_RPC_FAILED] * (len(keys) - len(codes))

    def _load_result(self, codes: Sequence[int], elapsed: float, on_disk: Sequence[bool]) -> LoadResult:
        # NOTE: a positive size other than page_nbytes is a foreign object under our key: not usable.
        ok = tuple(c == self.page_nbytes for c in codes)
        ssd = tuple(good and disk for good, disk in zip(ok, on_disk)) if any(on_disk) else ()
        n, n_ssd = sum(ok), sum(ssd)
        self.metrics.hits.labels("load").inc(n)
        self.metrics.pages_read.inc(n)
        self.metrics.bytes_read.inc(n * self.page_nbytes)
        self.metrics.tier_pages_read.labels("dram").inc(n - n_ssd)
        self.metrics.tier_pages_read.labels("ssd").inc(n_ssd)
        if n == len(codes):
            return LoadResult(n, OK, ok, ssd)
        first = ok.index(False)
        self.metrics.hole_pages.inc(sum(ok[first:]))  # present after a missing page: read, not lost
        missed = [c for c, good in zip(codes, ok) if not good]
        reasons = [TRANSFER_FAILED if c >= 0 else classify(c, elapsed, self._deadline) for c in missed]
        for why, count in collections.Counter(reasons).items():
            self._miss("load", count, why)
        # for traces: a positive size is an object of another size (layout) under our key
        per_page = tuple(SIZE_MISMATCH if c > 0 else why for c, why in zip(missed, reasons))
        return LoadResult(n, reasons[0], ok, ssd, per_page)

    def save(self, keys: Sequence[str], addrs: Sequence[int]) -> SaveResult:
        """Write pages whose objects the store lacks; existing objects are skipped (never rewritten)."""
        check_pairs(keys, addrs)
        if not keys:
            return SaveResult(0, 0, 0, OK)
        client = self._connector.client()
        if client is None:
            self.metrics.save_failures.labels(DISABLED).inc(len(keys))
            return SaveResult(0, 0, len(keys), DISABLED, (False,) * len(keys))
        objects, where = self.objects.keys(keys), self.objects.addrs(addrs)
        per = len(self.objects.held)
        t0 = time.perf_counter()
        codes = [1] * len(objects)  # per object: 1 there already, 0 written, else the put's error
        try:
            exist = client.batch_is_exist(objects)
            todo = [i for i, c in enumerate(exist) if c != 1]
            if todo and self.before_write is not None:
                self.before_write(len({i // per for i in todo}))
            put = client.batch_put_from([objects[i] for i in todo], [where[i] for i in todo],
                                        [self.objects.group_nbytes] * len(todo)) if todo else []
            if self.ssd_dir:
                put = self._retry_no_space(client, objects, where, todo, list(put))
            put = list(put) + [_RPC_FAILED] * (len(todo) - len(put))  # a short answer fails the rest
            for i, c in zip(todo, put):
                codes[i] = c
        except Exception as e:  # noqa: BLE001
            log.warning("store save raised: %s", e)
            codes = [_RPC_FAILED] * len(objects)
        elapsed = self._observe("save", t0, codes)
        pages = [_page_save(cs) for cs in _chunks(codes, per)]   # per page: 0 written, 1 skipped, or error
        self.recent.add([k for k, cs in zip(keys, _chunks(codes, per)) if 0 in cs])  # any object written here
        written = pages.count(0)
        failed = [c for c in pages if c not in (0, 1)]
        self.metrics.pages_written.inc(written)
        self.metrics.bytes_written.inc(written * self.page_nbytes)
        self.metrics.pages_skipped.inc(pages.count(1))
        reason = OK
        if failed:
            reason = classify(failed[0], elapsed, self._deadline)
            self.metrics.save_failures.labels(reason).inc(len(failed))
        return SaveResult(written, pages.count(1), len(failed), reason, tuple(c in (0, 1) for c in pages))

    def _audit_recent_writes(self, switched_at: float) -> bool:
        """After a leader switch (connector thread, each tick until True): the pages written lately
        that the new leader lacks, any object of them (recent_writes.py), are dropped whole (their
        other objects removed: no reader finds half a page), counted and handed to on_lost."""
        client = self._connector.client()
        if client is None:
            return False
        try:
            lost = self.recent.audit(client, switched_at)
        except Exception as e:  # noqa: BLE001 - the new leader not reachable yet: the next tick retries
            log.info("store: auditing recent writes after the leader switch failed (%s); retrying", e)
            return False
        if lost is None:
            return False
        log.warning("store: after the leader switch the new leader lacks %d of the pages written lately%s",
                    len(lost), "; writing again those L1 holds" if lost else "")
        if lost:
            self.remove_many(lost)  # NOTE: a leased object stays (-706); a read of its page misses anyway
            self.metrics.lost_on_leader_change.inc(len(lost))
            if self.on_lost is not None:
                self.on_lost(lost)
        return True

    def _retry_no_space(self, client, keys, addrs, todo: list[int], codes: list[int]) -> list[int]:
        """With the SSD tier, DRAM refuses a write (-200) only until the master has evicted pages
        already copied to disk, within about one offload heartbeat: retry the refused pages a few
        times before counting them as failed (an I/O thread waits; requests never do)."""
        for _ in range(SSD_NO_SPACE_RETRIES):
            refused = [j for j, c in enumerate(codes) if c == _NO_SPACE]
            if not refused:
                break
            time.sleep(SSD_NO_SPACE_RETRY_S)
            again = client.batch_put_from([keys[todo[j]] for j in refused], [addrs[todo[j]] for j in refused],
                                          [self.objects.group_nbytes] * len(refused))
            for j, c in zip(refused, again):
                codes[j] = c
            self.metrics.no_space_retries.inc(len(refused))
        return codes

    def remove_many(self, keys: Sequence[str]) -> list[int]:
        """Remove pages (every object of each) in ONE batch_remove: per page 0, or a negative code
        (-704 absent, -706 a reader holds a lease on it, -900 master unreachable or store disabled).
        Never raises. A page some of whose objects were removed and others leased answers -706: the
        evictor tries it again later, and a read of it meanwhile misses (recomputed, never wrong).

        NOTE: never force=True: a leased object is being read right now (or was just found).
        """
        if not keys:
            return []
        client = self._connector.client()
        if client is None:
            return [_RPC_FAILED] * len(keys)
        objects = self.objects.all_keys(keys)
        t0 = time.perf_counter()
        try:
            codes = list(client.batch_remove(objects))
        except Exception as e:  # noqa: BLE001
            codes = []
            log.warning("batch_remove raised: %s", e)
        if len(codes) != len(objects):  # defensive: a short answer is a failure of the missing entries
            codes = codes + [_RPC_FAILED] * (len(objects) - len(codes))
        self._observe("remove", t0, codes)
        return [_page_remove(cs) for cs in _chunks(codes, self.objects.groups)]

    def close(self) -> None:
        """Stop the connector and close the client. Call after StoreIO.close() (no ops in flight)."""
        self._connector.stop()
        if self._tier_lookup is not None:
            self._tier_lookup.shutdown(wait=True, cancel_futures=True)

    # ------------------------------------------------------------------ helpers
    @property
    def _deadline(self) -> float:
        return self.cfg.op_timeout_s

    def _observe(self, op: str, t0: float, codes: Sequence[int]) -> float:
        elapsed = time.perf_counter() - t0
        self.metrics.op_seconds.labels(op).observe(elapsed)
        if any(c == _RPC_FAILED for c in codes):
            self._connector.report_rpc_failure()
        return elapsed

    def _miss(self, op: str, n: int, reason: str) -> None:
        self.metrics.misses.labels(op, reason).inc(n)

