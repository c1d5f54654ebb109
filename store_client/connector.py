"""StoreConnector: owns the Mooncake client's connection on a background thread (see store.py).

The serving path only reads `client()`: the live client while connected and healthy, else None
(the store counts as disabled and every op is an immediate, counted miss).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from store_client.addresses import ETCD, etcd_endpoints, metadata_for_mooncake, parse_master_address
from store_client.config import StoreConfig
from store_client.deferred_close import close_client
from store_client.leader_watch import LeaderWatch
from store_client.master_view import Leader, MasterView, master_view
from store_client.metrics import StoreMetrics

if TYPE_CHECKING:  # loaded at setup only (the native library); untyped, so read as Any
    from mooncake.store import MooncakeDistributedStore

log = logging.getLogger(__name__)

PROBE_KEY = "pdorch-probe/absent"
AUDIT_DEADLINE_S = 60.0  # after a leader switch, the store must be back within this to audit recent writes
_JOIN_S = 15.0  # a probe op against a dead master can take ~5 s (Mooncake's RPC timeout)
# HA masters: after the view changes (a new term, or none leads), look for the store back this often
# for this long: the new leader serves one lease (5 s) after it wins, and Mooncake's client switches by
# itself (its own etcd watch); reconnect_interval_s (5 s by default) would add up to its whole length.
RECOVER_POLL_S = 0.05
# The master answers before the client has re-mounted its segment (Mooncake's ping thread does that,
# up to ~1.5 s after the switch): meanwhile every object in it reads absent. So "back" means the
# client's own canary object (in its own segment) reads present, or the master answered "absent"
# this long (it restarted empty, or the canary was removed).
CANARY_GRACE_S = 3.0
RECOVER_WINDOW_S = 30.0
POLL_VIEW_S = 1.0  # the master view read this often while its etcd watch is down


def reachable(endpoints: Iterable[tuple[str, int]], timeout_s: float) -> str | None:
    """None when one of the (host, port) endpoints accepts a TCP connection, else the last error."""
    err = "no endpoint"
    for host, port in endpoints:
        try:
            with socket.create_connection((host.strip("[]"), port), timeout=timeout_s):
                return None
        except OSError as e:
            err = str(e)
    return err


def probe_master(cfg: StoreConfig, timeout_s: float = 1.0) -> str | None:
    """None when the master RPC port (in HA mode: an etcd endpoint) and the metadata server both
    answer, else what failed."""
    master = parse_master_address(cfg.master_address)
    err = reachable(master.endpoints, timeout_s)
    if err is not None:
        what = "etcd of the HA masters" if master.ha else "master"
        return f"{what} {cfg.master_address} unreachable ({err})"
    url = cfg.metadata_server
    if url.startswith("http"):
        probe = url + ("&" if "?" in url else "?") + urllib.parse.urlencode({"key": "pdorch_probe"})
        try:
            urllib.request.urlopen(probe, timeout=timeout_s).close()
        except urllib.error.HTTPError:
            pass  # any HTTP answer (404 for our probe key) means the server is up
        except (urllib.error.URLError, OSError) as e:
            return f"metadata server {url} unreachable ({e})"
    elif url.startswith(ETCD):
        err = reachable(etcd_endpoints(url, "store.metadata_server"), timeout_s)
        if err is not None:
            return f"metadata etcd {url} unreachable ({err})"
    return None


def ssd_environment(cfg: StoreConfig) -> None:
    """Mooncake reads its offload settings from the environment at setup (one client per process).

    The file-per-key backend: the default bucket backend wrote no page-sized object to disk in our
    measurement (docs/workers.md, "The SSD tier"), so evicted pages were lost as without SSD.
    """
    os.environ["MOONCAKE_OFFLOAD_STORAGE_BACKEND_DESCRIPTOR"] = "file_per_key_storage_backend"
    os.environ["MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS"] = str(cfg.ssd_offload_interval_s)
    if cfg.ssd_capacity_gb > 0:
        os.environ["MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES"] = str(int(cfg.ssd_capacity_gb * (1 << 30)))


class StoreConnector:
    def __init__(self, cfg: StoreConfig, metrics: StoreMetrics, component: str = ""):
        self.cfg = cfg
        # The SSD tier's directory of this worker (cfg.ssd_dir); the pid when no name is given.
        self.ssd_dir = cfg.ssd_dir(component or f"{cfg.local_hostname}_{os.getpid()}") if cfg.ssd_enabled else ""
        self.metrics = metrics
        self._raw: MooncakeDistributedStore | None = None  # once setup succeeded (kept while lost)
        self._client: MooncakeDistributedStore | None = None  # == _raw while healthy; read without the lock (atomic)
        self._buffers: list[tuple[int, int]] = []
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        master = parse_master_address(cfg.master_address)
        # HA masters: the etcd watch on the view wakes this thread on any change (set from etcd3's thread)
        self._view_changed = threading.Event()
        self._view: MasterView | None = None
        self._watch: LeaderWatch | None = None
        if master.ha:
            self._view = view = master_view(master.etcd_endpoints, cfg.master_cluster_id)
            self._watch = LeaderWatch(master.etcd_endpoints, view.key, self._on_view_change)
        self._view_read_at = 0.0
        self._view_empty = False  # the last read of the view found no term
        self._leader: Leader | None = None  # the last leader's term seen (HA masters)
        self._recover_until = 0.0  # monotonic: look for the store back every RECOVER_POLL_S until then
        # HA masters: after a leader switch, `audit(switched_at) -> done` runs each tick while connected
        # until it is done or AUDIT_DEADLINE_S passed (KVStore checks its recent writes).
        self.audit: Callable[[float], bool] | None = None
        self._audit_due: float | None = None
        # A tiny hard-pinned object in this client's own segment, written on connect (None: not written)
        self._canary: str | None = None
        self._canary_absent_since: float | None = None  # monotonic: the master first said "absent"
        metrics.enabled.set(0)

    def client(self) -> MooncakeDistributedStore | None:
        """The store client while the store is healthy, else None."""
        return self._client

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="store-connector", daemon=True)
        self._thread.start()

    def wait_connected(self, timeout_s: float) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: self._client is not None, timeout=timeout_s)

    def add_buffer(self, ptr: int, nbytes: int) -> None:
        with self._lock:
            self._buffers.append((ptr, nbytes))
            raw = self._raw
        if raw is not None:
            self._register(raw, ptr, nbytes)

    def report_rpc_failure(self) -> None:
        """An op saw -900: stop using the client at once; the connector thread checks when it is back."""
        self._disable("RPC failed")

    def _disable(self, why: str) -> None:
        with self._lock:
            if self._client is None:
                return
            self._client = None
        self.metrics.enabled.set(0)
        log.error("store master %s LOST (%s): store disabled, requests recompute; reconnecting",
                  self.cfg.master_address, why)
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._watch is not None:
            self._watch.close()
        if self._thread is not None:
            self._thread.join(timeout=_JOIN_S)
            if self._thread.is_alive():
                log.warning("store connector thread still busy after %.0fs; leaving it (daemon)", _JOIN_S)
        with self._lock:
            raw, self._raw, self._client = self._raw, None, None
            buffers = list(self._buffers)
        self.metrics.enabled.set(0)
        if raw is not None:
            for ptr, _ in buffers:
                try:
                    raw.unregister_buffer(ptr)
                except Exception:  # best effort at shutdown
                    log.debug("unregister_buffer(%#x) failed", ptr, exc_info=True)
            close_client(raw, parse_master_address(self.cfg.master_address).ha)

    # ------------------------------------------------------------------ connector thread
    def _run(self) -> None:
        announced = False  # the "store DISABLED" error is logged once per outage, not every retry
        while not self._stop.is_set():
            if self._raw is None:
                err = probe_master(self.cfg) or self._setup()
                if err is None:
                    announced = False
                else:
                    self.metrics.connect_failures.inc()
                    if not announced:
                        log.error("store DISABLED: %s; serving without the L3 KV tier, retrying every %.1fs",
                                  err, self.cfg.reconnect_interval_s)
                        announced = True
            elif self._client is None:
                self._try_recover()
            elif self._raw.health_check() != 0:
                self.report_rpc_failure()
                continue
            self._watch_leader()
            self._audit_after_switch()
            self._wake.wait(self._interval())
            self._wake.clear()

    def _interval(self) -> float:
        """Seconds to the next tick: the health check while connected; while lost, reconnect_interval_s,
        or RECOVER_POLL_S right after the master view changed (HA masters: the store comes back when the
        new leader serves, and the first hit should not wait for a slow retry)."""
        if self._client is not None:
            interval = min(1.0, self.cfg.reconnect_interval_s)
        elif time.monotonic() < self._recover_until:
            interval = RECOVER_POLL_S
        else:
            interval = self.cfg.reconnect_interval_s
        if self._watch is not None and (not self._watch.active or self._view_empty):
            interval = min(interval, POLL_VIEW_S)  # no watch, or no term read: read the view as the poll did
        return interval

    def _on_view_change(self) -> None:
        """etcd3's watch thread: the master view changed (or the watch ended); the connector reads it."""
        self._view_changed.set()
        self._wake.set()

    @property
    def leader(self) -> str | None:
        """HA masters: the leader's RPC address as last read from etcd (None before any, or for a
        single master)."""
        return None if self._leader is None else self._leader.address

    def _watch_leader(self) -> None:
        """HA masters: which one leads, from etcd (metrics, and a log line when the lead moves).

        Read when the etcd watch on the view says it changed (or was (re)started), and every
        POLL_VIEW_S while the watch is down. A switch is a new term, not a new address: a master
        restarted at the same address that wins again starts empty, and its clients' recent writes are
        audited like after any switch (master_view.Leader). The view changing at all (the leader's
        lease gone, a new term) disables the store at once: requests miss instead of waiting on a
        master that is gone, and the connector looks for the store back every RECOVER_POLL_S."""
        view, watch = self._view, self._watch
        if view is None or watch is None:  # a single master (both are made for HA masters only)
            return
        restarted = watch.ensure()
        now = time.monotonic()
        # Polled too while the watch is down, and while the last read found no term (none leads, or etcd
        # did not answer: the change the watch reported must not be lost to one failed read).
        polled = (not watch.active or self._view_empty) and now - self._view_read_at >= POLL_VIEW_S
        if not (restarted or self._view_changed.is_set() or polled):
            return
        self._view_changed.clear()
        self._view_read_at = now
        leader = view.term()
        self._view_empty = leader is None
        self._on_term(leader)

    def _on_term(self, leader: Leader | None) -> None:
        """One read of the view. None (none leads, or etcd did not answer) keeps the last term: the
        same term read after it is no switch."""
        self.metrics.master_leading.set(1 if leader else 0)
        if leader is not None and leader == self._leader:
            return
        if self._leader is not None:  # the lease ran out or another term leads: the client must switch
            self._recover_until = time.monotonic() + RECOVER_WINDOW_S
        if leader is None:
            return
        if self._leader is not None:
            self.metrics.master_leader_changes.inc()
            again = " again, a new term" if leader.address == self._leader.address else ""
            log.warning("store: mooncake_master %s leads now%s (was %s)", leader.address, again,
                        self._leader.address)
            self._audit_due = time.monotonic()
            self._disable(f"a new leader's term began ({leader.address})")
        self._leader = leader

    def _audit_after_switch(self) -> None:
        audit, due = self.audit, self._audit_due
        if due is None:
            return
        ready = audit is not None and self._client is not None
        if audit is not None and ready and audit(due):
            self._audit_due = None
        elif time.monotonic() - due > AUDIT_DEADLINE_S:  # given up on, once
            if not ready:
                log.warning("store: recent writes not audited after the leader switch (store not back in %.0fs)",
                            AUDIT_DEADLINE_S)
            self._audit_due = None

    def _setup(self) -> str | None:
        from mooncake.store import MooncakeDistributedStore  # deferred: loads the native library

        cfg = self.cfg
        raw = MooncakeDistributedStore()
        if self.ssd_dir:
            ssd_environment(cfg)
            os.makedirs(self.ssd_dir, exist_ok=True)  # Mooncake refuses a directory that does not exist
        # NOTE: holds the GIL for its whole duration (~90 s if the master vanished since the probe).
        rc = raw.setup(cfg.local_hostname, metadata_for_mooncake(cfg.metadata_server), cfg.global_segment_size_mb << 20,
                       cfg.local_buffer_size_mb << 20, cfg.protocol, cfg.device_name,
                       parse_master_address(cfg.master_address).mooncake,
                       enable_ssd_offload=bool(self.ssd_dir), ssd_offload_path=self.ssd_dir)
        if rc != 0:
            return f"store setup against master {cfg.master_address} / {cfg.metadata_server} failed ({rc})"
        with self._lock:
            buffers = list(self._buffers)
        for ptr, nbytes in buffers:
            self._register(raw, ptr, nbytes)
        self._put_canary(raw)
        with self._changed:
            self._raw = self._client = raw
            self._changed.notify_all()
        self.metrics.enabled.set(1)
        log.info("store connected: master %s, metadata %s, %s, contributing %d MiB",
                 cfg.master_address, cfg.metadata_server, cfg.protocol, cfg.global_segment_size_mb)
        return None

    def _try_recover(self) -> None:
        """Lost -> connected once the client's own reconnect succeeded, a real RPC answers AND the master
        knows this client's segment again (its canary reads present; see CANARY_GRACE_S).

        NOTE: the client re-mounts its segment into a restarted master shortly after (~1 s), so the
        first saves after a reconnect may fail with no_space (counted; write-back is best effort).
        """
        raw = self._raw
        if raw is None:  # stop() took it meanwhile
            return
        codes = raw.batch_is_exist([self._canary or PROBE_KEY]) if raw.health_check() == 0 else [-1]
        if not codes or codes[0] < 0:
            self._canary_absent_since = None
            return
        if self._canary is not None and codes[0] == 0:
            now = time.monotonic()
            if self._canary_absent_since is None:
                self._canary_absent_since = now
            if now - self._canary_absent_since < CANARY_GRACE_S:
                return
            self._put_canary(raw)  # the master lost it (restarted empty): the next outage has one again
        self._canary_absent_since = None
        with self._changed:
            self._client = raw
            self._changed.notify_all()
        self.metrics.enabled.set(1)
        self.metrics.reconnects.inc()
        log.warning("store master %s is back: store re-enabled", self.cfg.master_address)

    def _put_canary(self, raw: MooncakeDistributedStore) -> None:
        """Write this client's canary into its own segment, pinned (never evicted). Without a segment of
        its own (or if the put fails) the recovery check falls back to an RPC on an absent key."""
        from mooncake.store import ReplicateConfig  # deferred: loads the native library

        self._canary = None
        if self.cfg.global_segment_size_mb <= 0:
            return
        where = ReplicateConfig()
        where.replica_num = 1
        where.preferred_segment = raw.get_hostname()
        where.with_hard_pin = True
        key = f"pdorch-canary/{raw.get_hostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"
        try:
            rc = raw.put(key, b"pdorch", where)
        except Exception as e:  # noqa: BLE001
            rc = -1
            log.debug("canary put raised: %s", e)
        if rc == 0:
            self._canary = key
        else:
            log.info("store: no canary object (put returned %s); recovery checks an RPC only", rc)

    def _register(self, raw: MooncakeDistributedStore, ptr: int, nbytes: int) -> None:
        rc = raw.register_buffer(ptr, nbytes)
        if rc != 0:  # TCP works unregistered (with a copy); RDMA would fail every op
            log.error("store register_buffer(%#x, %d) failed (%d): zero-copy disabled for it", ptr, nbytes, rc)
