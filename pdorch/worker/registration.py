"""Worker-side etcd registration: a key under a lease, kept alive by a thread.

    key   /{cluster}/workers/{role}/{worker_id}
    value {"address": "host:port", "role": ..., "worker_id": ..., "info": {...}}   (JSON)

The lease has `discovery.lease_ttl_s`; the keep-alive thread refreshes it every TTL/3. If the
process dies or stops renewing, etcd deletes the key when the lease expires, and routers
watching the prefix drop the worker. If a refresh finds the lease gone (etcd restarted, long
pause), the thread grants a new lease and puts the key again. If a refresh fails (the member it
talks to is down), it connects through the next endpoint that answers: a lease belongs to the
cluster, not to one member, so it is refreshed there. Torch-free.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Self

import etcd3

from pdorch.config import DiscoveryConfig

log = logging.getLogger("pdorch.worker.registration")


def worker_key(cluster: str, role: str, worker_id: str) -> str:
    return f"/{cluster}/workers/{role}/{worker_id}"


def workers_prefix(cluster: str) -> str:
    return f"/{cluster}/workers/"


def connect(endpoints: tuple[str, ...] | list[str], timeout_s: float = 5.0,
            after: str | None = None) -> etcd3.Etcd3Client:
    """A client for the first endpoint that answers (those after `after` first, e.g. the one that just
    failed); ConnectionError naming all of them otherwise. `client.endpoint` says which one."""
    endpoints = list(endpoints)
    if after in endpoints:
        i = endpoints.index(after) + 1
        endpoints = endpoints[i:] + endpoints[:i]
    errors = []
    for ep in endpoints:
        host, _, port = ep.rpartition(":")
        try:
            client = etcd3.client(host=host or "127.0.0.1", port=int(port), timeout=timeout_s)
            client.status()
            client.endpoint = ep
            return client
        except Exception as e:  # noqa: BLE001 - collect and report every endpoint's failure
            errors.append(f"{ep}: {e.__class__.__name__}: {e}")
    raise ConnectionError("no etcd endpoint answered: " + "; ".join(errors))


class WorkerRegistration:
    def __init__(self, discovery_cfg: DiscoveryConfig, role: str, worker_id: str, address: str,
                 info: dict | None = None):
        if role not in ("prefill", "decode"):
            raise ValueError(f"role must be 'prefill' or 'decode', got {role!r}")
        self.cfg = discovery_cfg
        self.key = worker_key(discovery_cfg.cluster, role, worker_id)
        self.value = json.dumps({"address": address, "role": role, "worker_id": worker_id, "info": info or {}})
        self.ttl = discovery_cfg.lease_ttl_s
        self._client: etcd3.Etcd3Client | None = None
        self._lease: etcd3.Lease | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Self:
        self._client = client = connect(self.cfg.etcd_endpoints)
        self._register(client)
        self._thread = threading.Thread(target=self._keep_alive, name=f"etcd-keepalive {self.key}", daemon=True)
        self._thread.start()
        log.info("registered %s (lease TTL %ss)", self.key, self.ttl)
        return self

    def _register(self, client: etcd3.Etcd3Client) -> None:
        self._lease = client.lease(self.ttl)
        client.put(self.key, self.value, lease=self._lease)

    def _keep_alive(self) -> None:
        interval = max(0.2, self.ttl / 3.0)
        while not self._stop.wait(interval):
            client, lease = self._client, self._lease
            if client is None or lease is None:  # stop() closed the client: nothing to renew
                return
            try:
                ttl = None
                for resp in client.refresh_lease(lease.id):
                    ttl = resp.TTL
                if not ttl or ttl <= 0:  # lease expired or unknown: register again
                    log.warning("lease of %s expired; registering again", self.key)
                    self._register(client)
            except Exception as e:  # noqa: BLE001 - etcd briefly unreachable: keep trying
                log.warning("etcd keep-alive for %s failed: %s", self.key, e)
                self._reconnect()

    def _reconnect(self) -> None:
        """Move to another endpoint when more than one is configured (the next loop refreshes there)."""
        if len(self.cfg.etcd_endpoints) < 2:
            return
        try:
            client = connect(self.cfg.etcd_endpoints, after=getattr(self._client, "endpoint", None))
        except ConnectionError as e:
            log.warning("etcd: %s", e)
            return
        old, self._client = self._client, client
        if self._lease is not None:  # NOTE: the Lease object calls through the client it was made by
            self._lease = etcd3.Lease(self._lease.id, self.ttl, client)
        log.warning("etcd keep-alive for %s now through %s", self.key, client.endpoint)
        if old is None:  # stop() ran meanwhile and closed it
            return
        try:
            old.close()
        except Exception as e:  # noqa: BLE001 - the old member is gone anyway
            log.debug("closing the client of %s: %s", getattr(old, "endpoint", "?"), e)

    def stop(self) -> None:
        """Stop renewing and delete the key now (revoking the lease)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self._client is not None:
            try:
                if self._lease is not None:
                    self._lease.revoke()
            except Exception as e:  # noqa: BLE001 - the key expires with its lease anyway
                log.warning("could not revoke the lease of %s: %s", self.key, e)
            self._client.close()
            self._client = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
