"""HA masters: an etcd watch on the master view key, so a worker hears of a new leader (or of none)
the moment etcd records it instead of at its next poll.

python3-etcd3 runs the watch on its own thread and calls back there; the callback only records that
the view changed and wakes the owner (the store connector's thread), which reads the term itself.
A watch that ends (etcd down or restarted, the member lost, a compaction) is marked broken and the
owner's next `ensure()` starts it again from a fresh read, so no change between the two is missed:
the owner reads the term after every (re)start.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import etcd3

import store_client.etcd_compat  # noqa: F401  (mends etcd3's watch thread)

log = logging.getLogger(__name__)

WATCH_TIMEOUT_S = 2.0  # etcd must accept the watch within this; else the owner polls until the next try


class LeaderWatch:
    """A watch on one etcd key, (re)started by its owner's thread; `changed` wakes the owner."""

    def __init__(self, endpoints: tuple[str, ...], key: str, changed: Callable[[], None]):
        self.endpoints, self.key, self._changed = tuple(endpoints), key, changed
        self._client = None
        self._watch_id = None
        self._next = 0  # the endpoint tried next (round robin over the members)
        self._lock = threading.Lock()
        self._broken = True  # not watching: start at the first ensure()
        self._closed = False
        self._generation = 0  # which watch's callbacks count: a stopped watch's last call is ignored

    @property
    def active(self) -> bool:
        """Whether the watch runs (a change will wake the owner); else the owner must poll."""
        return not self._broken

    def ensure(self) -> bool:
        """Start the watch if it is not running (owner's thread; at most WATCH_TIMEOUT_S per member
        tried). True when it was (re)started now: the owner must read the key, which may have changed
        while nothing watched it."""
        with self._lock:
            if self._closed or not self._broken:
                return False
            self._stop_locked()
            generation = self._generation
        for _ in range(len(self.endpoints)):
            endpoint = self.endpoints[self._next % len(self.endpoints)]
            self._next += 1
            host, _, port = endpoint.rpartition(":")
            client = None
            try:
                client = etcd3.client(host=host.strip("[]"), port=int(port), timeout=WATCH_TIMEOUT_S)
                watch_id = client.add_watch_callback(self.key, lambda resp: self._on_event(generation, resp))
            except Exception as e:  # noqa: BLE001 - etcd3 raises its own and grpc's errors: try the next member
                log.debug("watching %s on etcd %s failed: %s", self.key, endpoint, e)
                if client is not None:
                    client.close()
                continue
            with self._lock:
                if self._closed or generation != self._generation:  # closed meanwhile: drop it
                    client.cancel_watch(watch_id)
                    client.close()
                    return False
                self._client, self._watch_id, self._broken = client, watch_id, False
            return True
        return False

    def close(self) -> None:
        """Cancel the watch and close its etcd connection (ends etcd3's watch thread)."""
        with self._lock:
            self._closed = True
            self._stop_locked()

    def _stop_locked(self) -> None:
        client, watch_id, self._client, self._watch_id = self._client, self._watch_id, None, None
        self._broken = True
        self._generation += 1
        if client is None:
            return
        try:
            if watch_id is not None:
                client.cancel_watch(watch_id)
        except Exception:  # the stream may be gone already; closing is what matters
            log.debug("cancelling the master view watch failed", exc_info=True)
        client.close()

    # ------------------------------------------------------------------ etcd3's watch thread
    def _on_event(self, generation: int, resp) -> None:
        ended = resp is None or isinstance(resp, Exception)  # None: the stream ended
        with self._lock:
            if self._closed or generation != self._generation:  # a stopped watch's last word
                return
            self._broken = self._broken or ended
        if ended:
            log.warning("store: the etcd watch on the master view ended (%s); watching again",
                        resp or "stream closed")
        self._changed()
