"""The keys this worker wrote lately, for the audit after a master leader switch.

Mooncake's HA masters replicate the object index to the standbys through an oplog in etcd; a write
the leader acknowledged in its last moments may not have reached the standby that takes over
(measured: pages written 0 s before a leader's SIGKILL were missing after the switch in 3 of 5
kills, pages written 3 s before never; docs/workers.md, "Master HA"). So the store client keeps the
keys it wrote in the last `window_s`, and after a switch asks the new leader which of them it
knows; the missing ones go to the worker, which writes again those its L1 still holds.

NOTE: two looks at least RECHECK_S apart, and only keys missing in both are lost: right after a
switch the new leader answered "absent" for pages that read back a moment later
(bench/master_failover.py).

Thread-safe: the I/O threads add, the store connector's thread audits.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Sequence

WINDOW_S = 20.0  # well past the 3 s after which a write was always kept, and the ~1 s etcd read
MAX_KEYS = 16384  # ~1.5 MiB of keys; a worker writing faster than this in WINDOW_S audits the newest
RECHECK_S = 2.0  # after a leader switch, keys missing at two looks this far apart are lost


class RecentWrites:
    def __init__(self, window_s: float = WINDOW_S, max_keys: int = MAX_KEYS,
                 clock: Callable[[], float] = time.monotonic):
        self.window_s, self._clock = window_s, clock
        self._written: collections.deque[tuple[float, str]] = collections.deque(maxlen=max_keys)
        self._lock = threading.Lock()
        self._look: tuple[float | None, list[str] | None, float] = (None, None, 0.0)  # (switch, suspects, when)

    def add(self, keys: Sequence[str]) -> None:
        now = self._clock()
        with self._lock:
            self._written.extend((now, k) for k in keys)

    def since(self, t: float) -> list[str]:
        """The distinct keys written at or after `t - window_s` (oldest first)."""
        with self._lock:
            while self._written and self._written[0][0] < self._clock() - 2 * self.window_s:
                self._written.popleft()  # NOTE: pruned here, off the write path
            return list(dict.fromkeys(k for when, k in self._written if when >= t - self.window_s))

    def audit(self, client, switched_at: float) -> list[str] | None:
        """One step of the audit after the switch at `switched_at`, against the new leader's
        `client` (connector thread): the keys it lacks at two looks, or None to be called again."""
        first, suspects, looked_at = self._look
        if first != switched_at:  # a new switch: start over
            suspects, looked_at = None, 0.0
        if suspects is not None and self._clock() - looked_at < RECHECK_S:
            return None
        keys = suspects if suspects is not None else self.since(switched_at)
        if not keys:
            return []
        exist = client.batch_is_exist(keys)  # raises while the new leader is not reachable: retried
        if len(exist) != len(keys) or any(c < 0 for c in exist):
            return None
        missing = [k for k, c in zip(keys, exist) if c != 1]
        if suspects is None and missing:  # the first look: look again before calling them lost
            self._look = (switched_at, missing, self._clock())
            return None
        self._look = (None, None, 0.0)
        return missing
