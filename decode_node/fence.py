"""PageFence: pages of a failed prefill go back to D's pool only once no KV write into them can land.

P writes a prompt's KV straight into D's pages (one `batch_transfer_sync_write`). When D gives up
on the prefill (its client went away, the deadline passed, P failed or vanished) that write may
still be running; pages handed to another request meanwhile would be silently corrupted. So:

    P answered with writes_over (trailing metadata)  -> released at once (not fenced at all)
    otherwise -> fenced here; every RETRY_S ask P, until CONFIRM_TIMEOUT_S:
        P's Abort RPC answers OK (it waits for the push to stop)  -> released   outcome "confirmed"
        P's address refuses connections (the process is gone)    -> released   outcome "peer_gone"
    past CONFIRM_TIMEOUT_S -> kept out of the pool on purpose              outcome "held"
        (still asked every HELD_RETRY_S; a late confirmation releases them: "confirmed_late")

Pages are counted per outcome in `pdorch_decode_fenced_pages_total{outcome}`; the gauges
`pdorch_decode_fence_pending_pages` / `pdorch_decode_fence_held_pages` show what is out right now.
`confirm(address, request_id)` returns "confirmed", "peer_gone" or None (not yet); it is the
decode worker's PrefillClient.confirm_writes_over, a small fake in unit tests.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from prometheus_client import Counter, Gauge

log = logging.getLogger(__name__)

CONFIRM_TIMEOUT_S = 30.0  # how long P gets to confirm before the pages are held on purpose
RETRY_S = 0.5
HELD_RETRY_S = 10.0
OUTCOMES = ("confirmed", "peer_gone", "held", "confirmed_late")


@dataclass(eq=False)
class Fenced:
    address: str  # the prefill worker that may still write
    request_id: str
    pages: list[int]
    deadline: float  # time.monotonic() of the confirmation deadline
    next_try: float = 0.0
    held: bool = False


class PageFence:
    def __init__(self, release, confirm, registry=None, confirm_timeout_s: float = CONFIRM_TIMEOUT_S,
                 retry_s: float = RETRY_S, held_retry_s: float = HELD_RETRY_S):
        self._release, self._confirm = release, confirm
        self._timeout_s, self._retry_s, self._held_retry_s = confirm_timeout_s, retry_s, held_retry_s
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._entries: list[Fenced] = []
        self.counts = dict.fromkeys(OUTCOMES, 0)  # pages per outcome (Stats, tests)
        self._pages = Counter("pdorch_decode_fenced_pages", "Pages of failed prefills kept out of the pool until "
                              "P confirmed no KV write into them can land, by outcome", ["outcome"],
                              registry=registry)
        for outcome in OUTCOMES:
            self._pages.labels(outcome)
        Gauge("pdorch_decode_fence_pending_pages", "Pages waiting for P's confirmation", registry=registry
              ).set_function(lambda: self.num_pages(held=False))
        Gauge("pdorch_decode_fence_held_pages", "Pages kept out of the pool on purpose: P did not confirm "
              "within the deadline", registry=registry).set_function(lambda: self.num_pages(held=True))
        self._thread = threading.Thread(target=self._run, name="page-fence", daemon=True)
        self._thread.start()

    def hold(self, address: str, request_id: str, pages: list[int]) -> None:
        """Keep `pages` out of the pool until P at `address` confirms (called by handler threads)."""
        if not pages:
            return
        with self._lock:
            self._entries.append(Fenced(address, request_id, list(pages), time.monotonic() + self._timeout_s))
        self._wake.set()

    def num_pages(self, held: bool) -> int:
        with self._lock:
            return sum(len(e.pages) for e in self._entries if e.held == held)

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                due = [e for e in self._entries if e.next_try <= time.monotonic()]
            for entry in due:
                self._try(entry)
            with self._lock:
                wait = min((e.next_try for e in self._entries), default=time.monotonic() + 3600) - time.monotonic()
            self._wake.wait(max(wait, 0.0))
            self._wake.clear()

    def _try(self, entry: Fenced) -> None:
        try:
            outcome = self._confirm(entry.address, entry.request_id)
        except Exception:  # a bug in confirming must not kill the fence: count as "not yet"
            log.exception("confirming the KV writes of %s stopped failed", entry.request_id)
            outcome = None
        now = time.monotonic()
        if outcome is not None:
            self._done(entry, "confirmed_late" if entry.held else outcome)
            self._release(entry.pages)
            return
        if not entry.held and now >= entry.deadline:
            entry.held = True
            self._count(entry, "held")
            log.warning("prefill worker %s did not confirm within %.0fs that no KV write of %s can land; "
                        "holding its %d pages out of the pool", entry.address, self._timeout_s,
                        entry.request_id, len(entry.pages))
        entry.next_try = now + (self._held_retry_s if entry.held else self._retry_s)

    def _done(self, entry: Fenced, outcome: str) -> None:
        with self._lock:
            self._entries.remove(entry)
        self._count(entry, outcome)

    def _count(self, entry: Fenced, outcome: str) -> None:
        with self._lock:
            self.counts[outcome] += len(entry.pages)
        self._pages.labels(outcome).inc(len(entry.pages))
