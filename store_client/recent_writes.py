"""The pages this worker wrote lately, for the audit after a master leader switch.

Mooncake's HA masters replicate the object index to the standbys through an oplog in etcd; a write
the leader acknowledged in its last moments may not have reached the standby that takes over
(measured: pages written 0 s before a leader's SIGKILL were missing after the switch in 3 of 5
kills, pages written 3 s before never; docs/workers.md, "Master HA"), and a leader restarted at its
own address starts empty. So the store client keeps the pages it wrote in the last `window_s`
seconds (store.audit_window_s), and after a switch asks the new leader which of them it holds; the
missing ones go to the worker, which writes again those its L1 still holds.

By page, not object: a page is written as `groups` objects (page_objects.py) and is held only when
every one of them is; a page missing any object is lost whole (KVStore drops its other objects, so
no reader finds half a page).

Memory: one entry per distinct page (its key and the time of its last write), at most `max_pages`
(store.audit_max_pages). The rule when a worker writes more than that within the window: the oldest
writes leave first, so the audit covers the newest `max_pages` pages (the window is then shorter
than configured, logged once per overflow).

NOTE: two looks at least RECHECK_S apart, and only pages missing in both are lost: right after a
switch the new leader answered "absent" for pages that read back a moment later
(bench/reliability/master_failover.py).

Thread-safe: the I/O threads add, the store connector's thread audits.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence

from store_client.page_objects import PageObjects

log = logging.getLogger(__name__)

RECHECK_S = 2.0  # after a leader switch, pages missing at two looks this far apart are lost
EXIST_BATCH = 8192  # objects per batch_is_exist of the audit (one RPC each)


class RecentWrites:
    def __init__(self, window_s: float, max_pages: int, objects: PageObjects,
                 clock: Callable[[], float] = time.monotonic):
        if window_s <= 0 or max_pages < 1:
            raise ValueError(f"the audit needs window_s > 0 and max_pages >= 1, got {window_s}, {max_pages}")
        self.window_s, self.max_pages, self.objects, self._clock = window_s, max_pages, objects, clock
        self._written: collections.OrderedDict[str, float] = collections.OrderedDict()  # page -> last write, oldest first
        self._lock = threading.Lock()
        self._overflowing = False
        self._look: tuple[float | None, list[str] | None, float] = (None, None, 0.0)  # (switch, suspects, when)

    def add(self, pages: Sequence[str]) -> None:
        """Pages this worker just wrote (any of their objects)."""
        now = self._clock()
        with self._lock:
            for page in pages:
                self._written[page] = now
                self._written.move_to_end(page)
            self._prune(now)

    def _prune(self, now: float) -> None:
        """Drop writes older than two windows (the audit may start a while after the switch), then
        the oldest beyond max_pages. Amortized O(1) per write."""
        written = self._written
        while written and next(iter(written.values())) < now - 2 * self.window_s:
            written.popitem(last=False)
        over = len(written) - self.max_pages
        overflowing = over > 0 and next(iter(written.values())) >= now - self.window_s
        if overflowing and not self._overflowing:
            log.warning("store: more than store.audit_max_pages=%d pages written in the last %.0f s; the audit "
                        "after a leader switch covers the newest %d only", self.max_pages, self.window_s,
                        self.max_pages)
        self._overflowing = overflowing
        for _ in range(max(0, over)):
            written.popitem(last=False)

    def __len__(self) -> int:
        return len(self._written)

    def since(self, t: float) -> list[str]:
        """The distinct pages written at or after `t - window_s` (oldest first)."""
        with self._lock:
            return [k for k, when in self._written.items() if when >= t - self.window_s]

    def audit(self, client, switched_at: float) -> list[str] | None:
        """One step of the audit after the switch at `switched_at`, against the new leader's
        `client` (connector thread): the pages it lacks (any object) at two looks, or None to be
        called again."""
        first, suspects, looked_at = self._look
        if first != switched_at:  # a new switch: start over
            suspects, looked_at = None, 0.0
        if suspects is not None and self._clock() - looked_at < RECHECK_S:
            return None
        pages = suspects if suspects is not None else self.since(switched_at)
        if not pages:
            return []
        held = self._held(client, pages)  # raises while the new leader is not reachable: retried
        if held is None:
            return None
        missing = [k for k, ok in zip(pages, held) if not ok]
        if suspects is None and missing:  # the first look: look again before calling them lost
            self._look = (switched_at, missing, self._clock())
            return None
        self._look = (None, None, 0.0)
        return missing

    def _held(self, client, pages: list[str]) -> list[bool] | None:
        """Per page: the store holds every object of it this worker writes (None: an answer failed)."""
        objects, per = self.objects.keys(pages), len(self.objects.held)
        codes: list[int] = []
        for i in range(0, len(objects), EXIST_BATCH):
            batch = objects[i:i + EXIST_BATCH]
            exist = client.batch_is_exist(batch)
            if len(exist) != len(batch) or any(c < 0 for c in exist):
                return None
            codes.extend(exist)
        return [c == 1 for c in PageObjects.fold(codes, per, min)]
