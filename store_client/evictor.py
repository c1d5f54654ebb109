"""StoreEvictor: pdorch decides what leaves the store, before mooncake_master's own eviction does.

The master evicts ~5% of all objects, oldest lease first, once it is `eviction_high_watermark_ratio`
full. It knows nothing of prefix chains: under a multi-turn load whose working set exceeds the store,
every conversation resends its whole context each round and LRU thrashes (cyclic access), and losing
a head page makes the whole tail useless to a prefix reader. So every `evict_interval_s` this thread:

    read the master's /metrics: allocated, capacity, key count
    fill = allocated / capacity;  nothing to do unless fill > evict_high_watermark
    deficit = ceil((allocated - evict_low_watermark * capacity) / page_nbytes)        pages
    share   = ceil(deficit * len(index) / max(master key count, len(index)))          this worker's part
    remove the share's victims (ChainIndex: pages of ended conversations first, then deepest and
    least recently used first), in batches

Several workers each remove their share of the keys they know, so together they remove ~ the deficit.
Results per key: removed or absent -> forgotten by the index; leased (-706, a reader holds it) ->
refreshed (it was just read), kept, and passed over for the rest of the pass; other failures -> kept,
counted, the pass ends. evict_high_watermark sits below the master's watermark, so the master's
generic eviction stays a backstop (for keys no worker knows, e.g. after a restart).

Never on a request's path: its own daemon thread, one HTTP GET (1 s timeout) and a few batch_remove
calls per pass; every failure is counted and logged, never raised.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from store_client.addresses import parse_master_address
from store_client.chain_index import ChainIndex
from store_client.config import StoreConfig
from store_client.master_view import master_view
from store_client.results import _LEASED, _NOT_FOUND
from store_client.store import KVStore

log = logging.getLogger(__name__)

# Metric names of mooncake_master's Prometheus /metrics (read from a running 0.3.13 master).
ALLOCATED = "master_allocated_bytes"
CAPACITY = "master_total_capacity_bytes"
KEY_COUNT = "master_key_count"
# The master's own (generic) eviction, under short names for `pdorch status` and benchmarks.
MASTER_EVICTION_COUNTERS = {
    "evicted_keys": "master_evicted_key_count",
    "evicted_bytes": "master_evicted_size_bytes",
    "eviction_runs": "master_successful_evictions_total",
    "eviction_attempts": "master_attempted_evictions_total",
    "put_no_space": "master_put_start_alloc_failures_total",
}

REMOVE_BATCH = 256  # keys per batch_remove call: bounds one call, and how late stop() is noticed
# make_room() reads the master again when its last reading is older than this (one GET, ~0.5 ms):
# every worker writes (prefill write-backs, decode offloads and local prefills), and a reading
# plus only this worker's own writes since misses the others' writes.
FRESH_S = 0.02
_METRICS_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class MasterFill:
    allocated_bytes: float
    capacity_bytes: float
    key_count: float

    @property
    def ratio(self) -> float:
        return self.allocated_bytes / self.capacity_bytes if self.capacity_bytes > 0 else 0.0


def master_metrics_url(cfg: StoreConfig, leader: str | None = None) -> str | None:
    """The master's Prometheus endpoint: host of store.master_address (in HA mode: of the leader,
    `leader` when the caller knows it, else read from etcd; None while none leads), port
    store.master_metrics_port."""
    master = parse_master_address(cfg.master_address)
    if master.ha:
        leader = leader or master_view(master.etcd_endpoints, cfg.master_cluster_id).leader()
        if leader is None:
            return None
        host = leader.rpartition(":")[0]
    else:
        host = master.endpoints[0][0]
    return f"http://{host}:{cfg.master_metrics_port}/metrics"


def parse_metrics(text: str) -> dict[str, float]:
    """Unlabelled samples of a Prometheus text page: {name: value}; labelled ones are skipped."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 2 or line.startswith("#") or "{" in parts[0]:
            continue
        try:
            values[parts[0]] = float(parts[1])
        except ValueError:
            continue
    return values


def master_fill(text: str) -> MasterFill | None:
    """Allocated / capacity / key count from the master's /metrics text, None if any is missing."""
    values = parse_metrics(text)
    if not all(name in values for name in (ALLOCATED, CAPACITY, KEY_COUNT)):
        return None
    return MasterFill(values[ALLOCATED], values[CAPACITY], values[KEY_COUNT])


def master_eviction_counters(text: str) -> dict[str, float]:
    """The master's own eviction counters by short name (see MASTER_EVICTION_COUNTERS); a counter
    this master version does not export is left out, so "unknown" never reads as 0."""
    values = parse_metrics(text)
    return {short: values[name] for short, name in MASTER_EVICTION_COUNTERS.items() if name in values}


def fetch_text(url: str | None, timeout_s: float = _METRICS_TIMEOUT_S) -> str | None:
    """GET url as text, None on any failure (logged at debug: it repeats every pass while down) or
    without a url (no master leads)."""
    if url is None:
        return None
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return r.read().decode(errors="replace")
    except (urllib.error.URLError, OSError, ValueError) as e:
        log.debug("GET %s failed: %s", url, e)
        return None


def pages_to_remove(fill: MasterFill, index_pages: int, page_nbytes: int, low_watermark: float) -> int:
    """This worker's share of the pages that bring the store down to low_watermark."""
    deficit = math.ceil((fill.allocated_bytes - low_watermark * fill.capacity_bytes) / page_nbytes)
    if deficit <= 0 or index_pages <= 0:
        return 0
    # NOTE: the key count covers every worker's pages; each removes in proportion to what it knows.
    return math.ceil(deficit * index_pages / max(fill.key_count, index_pages))


class StoreEvictor:
    """One daemon thread; start() / stop(timeout_s). run_once() is one pass (tests call it directly)."""

    def __init__(self, store: KVStore, index: ChainIndex, cfg: StoreConfig, master_metrics_url,
                 fresh_s: float = FRESH_S):
        """`master_metrics_url`: the URL, or a function giving it at each reading (HA masters: the
        leader's, None while none leads)."""
        if not cfg.evict_low_watermark < cfg.evict_high_watermark:
            raise ValueError(f"store.evict_low_watermark ({cfg.evict_low_watermark}) must be below "
                             f"store.evict_high_watermark ({cfg.evict_high_watermark})")
        self.store = store
        self.index = index
        self.cfg = cfg
        self.url = master_metrics_url if callable(master_metrics_url) else (lambda: master_metrics_url)
        self.metrics = store.metrics
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._forgotten_seen = 0  # index.forgotten already added to the counter
        self.removed_total = 0  # pages removed since start (pdorch_store_evicted_pages_total, as a number)
        # The store's fill as last read, plus what this worker wrote since: make_room() acts on it
        # between two passes (a request's write-back can be tens of MB, faster than a pass).
        self._lock = threading.Lock()  # one removal at a time (the pass, or a writer's make_room)
        self._capacity = 0.0
        self._estimate = 0.0  # bytes
        self._read_at = float("-inf")  # when the master's fill was last read
        self.fresh_s = fresh_s
        # Told the keys that left the store (removed or found absent), from the evictor's threads:
        # the prefill worker keeps such pages in L1 longer (L1 then holds what the store lacks).
        self.on_removed = None
        # The highest priority this worker removed lately: the store's "water level". A page that
        # would rank below it is the next victim anyway, so writers skip it (should_write).
        self.cutoff: float | None = None

    def start(self) -> StoreEvictor:
        if self._thread is not None:
            raise RuntimeError("StoreEvictor already started")
        self._thread = threading.Thread(target=self._loop, name="store-evictor", daemon=True)
        self._thread.start()
        log.info("chain eviction on: remove above %.2f down to %.2f of the store, every %.2fs, depth weight "
                 "%.3fs, index of %d pages; master metrics %s", self.cfg.evict_high_watermark,
                 self.cfg.evict_low_watermark, self.cfg.evict_interval_s, self.cfg.evict_depth_weight_s,
                 self.index.max_pages, self.url())
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Signal and join; a pass in progress ends after its current batch_remove."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("store evictor did not stop within %.1fs", timeout_s)

    def _loop(self) -> None:
        while not self._stop.wait(self.cfg.evict_interval_s):
            try:
                self.run_once()
            except Exception:  # a bug in one pass must not end eviction for good
                log.exception("store eviction pass failed")

    def run_once(self) -> int:
        """Read the fill level; above the high watermark remove this worker's share. Pages removed."""
        self._export_index_size()
        self.index.compact()  # here, off the schedulers' threads (see ChainIndex)
        if not self.store.enabled:
            return 0
        text = fetch_text(self.url())
        fill = master_fill(text) if text is not None else None
        if fill is None or fill.capacity_bytes <= 0:
            self.metrics.master_metrics_failures.inc()
            return 0
        self.metrics.fill_ratio.set(fill.ratio)
        with self._lock:
            self._take_reading(fill)
            if fill.ratio <= self.cfg.evict_high_watermark:
                return 0
            share = pages_to_remove(fill, len(self.index), self.store.page_nbytes, self.cfg.evict_low_watermark)
            removed = self._remove_lowest(share)
            self._estimate -= removed * self.store.page_nbytes
        self._export_index_size()
        log.debug("store %.3f full (%d keys): removed %d of a share of %d pages", fill.ratio, fill.key_count,
                  removed, share)
        return removed

    def make_room(self, n_pages: int) -> int:
        """Called by a writer (an I/O thread) before it puts n_pages: when the fill (read afresh when
        the last reading is older than `fresh_s`, else as last read plus this worker's writes since)
        would pass the high watermark, remove this worker's lowest pages down to the low watermark
        first, so a burst of writes never reaches the master's own (chain-blind) eviction. Returns
        the pages removed.

        NOTE: every worker writes, so a reading of the master's fill goes stale with the others'
        writes too: a decode step's offload and a prefill write-back landing between two passes
        could otherwise together pass the master's watermark, which is close above ours."""
        page = self.store.page_nbytes
        fresh = None
        if time.monotonic() - self._read_at > self.fresh_s and self.store.enabled:
            text = fetch_text(self.url())
            fresh = master_fill(text) if text is not None else None
        with self._lock:
            if fresh is not None and fresh.capacity_bytes > 0:
                self._take_reading(fresh)
            if self._capacity <= 0:
                return 0  # no fill read yet: the next pass decides
            after = self._estimate + n_pages * page
            removed = 0
            if after > self.cfg.evict_high_watermark * self._capacity:
                removed = self._remove_lowest(math.ceil((after - self.cfg.evict_low_watermark * self._capacity) / page))
            self._estimate = after - removed * page
        return removed

    def _take_reading(self, fill: MasterFill) -> None:
        """(lock held) The master's fill as just read replaces the estimate."""
        self._capacity, self._estimate, self._read_at = fill.capacity_bytes, fill.allocated_bytes, time.monotonic()

    def should_write(self, depth: int, n_pages: int = 1) -> bool:
        """Whether a page at `depth`, touched now, is worth writing: always while the store has room
        below the high watermark, else only if it ranks above what eviction is removing now."""
        room = self._capacity <= 0 or (self._estimate + n_pages * self.store.page_nbytes
                                       <= self.cfg.evict_high_watermark * self._capacity)
        return room or self.cutoff is None or self.index.priority_now(depth) > self.cutoff

    def _remove_lowest(self, share: int) -> int:
        """Remove up to `share` of the lowest-priority keys, in batches; leased ones are passed over.

        NOTE: a reader leases every page of a conversation it looks up, and with a large depth
        weight the deep pages of a conversation read a moment ago are still the lowest priority
        after a refresh. Asking again for the same n victims would return them again and remove
        nothing, so each batch asks for n + (keys passed over) and skips those.
        """
        removed, passed_over = 0, set[str]()
        while removed < share and not self._stop.is_set():
            want = min(share - removed, REMOVE_BATCH)
            batch = [k for k in self.index.victims(want + len(passed_over)) if k not in passed_over][:want]
            if not batch:
                break  # the index has nothing else to offer
            n, leased, failed = self._remove(batch)
            removed += n
            passed_over.update(leased)
            if failed or len(passed_over) > 4 * share + REMOVE_BATCH:
                break  # the store is in trouble, or nearly all is being read: try again next pass
        return removed

    def _remove(self, keys: list[str]) -> tuple[int, list[str], int]:
        """One batch_remove; returns (pages removed, keys leased, number failed)."""
        stale = {k for k in keys if self.index.is_stale(k)}
        codes = self.store.remove_many(keys)
        # NOTE: stale pages (ended conversations) say nothing about the live ones' water level: a stale
        # head's priority is far above a live conversation's tail, and as the cutoff it would stop
        # every write-back of deep pages (should_write).
        removed_priorities = [p for k, c in zip(keys, codes)
                              if c == 0 and k not in stale and (p := self.index.priority(k)) is not None]
        if removed_priorities:
            self.cutoff = max(removed_priorities)
        gone = [k for k, c in zip(keys, codes) if c == 0 or c == _NOT_FOUND]
        leased = [k for k, c in zip(keys, codes) if c == _LEASED]
        removed = sum(1 for c in codes if c == 0)
        absent = len(gone) - removed
        failed = len(keys) - len(gone) - len(leased)
        self.index.forget(gone)
        self.index.refresh(leased)
        if gone and self.on_removed is not None:
            self.on_removed(gone)
        self.metrics.evicted_pages.inc(removed)
        self.removed_total += removed
        self.metrics.evicted_stale_pages.inc(sum(1 for k, c in zip(keys, codes) if c == 0 and k in stale))
        self.metrics.evict_skipped.labels("absent").inc(absent)
        self.metrics.evict_skipped.labels("leased").inc(len(leased))
        self.metrics.evict_skipped.labels("failed").inc(failed)
        return removed, leased, failed

    def _export_index_size(self) -> None:
        self.metrics.chain_index_pages.set(len(self.index))
        self.metrics.stale_after_seconds.set(self.index.stale_after() or 0.0)
        forgotten = self.index.forgotten
        self.metrics.chain_index_forgotten.inc(forgotten - self._forgotten_seen)
        self._forgotten_seen = forgotten
