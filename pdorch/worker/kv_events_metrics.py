"""pdorch_kv_events_*: the worker's KV event stream (pdorch/worker/kv_events.py) on its /metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

KINDS = ("l1_stored", "l1_removed", "store_written", "store_removed", "inflight_claimed", "inflight_released")
DROP_REASONS = ("slow", "overflow")
FIELDS = ("hash_scheme", "page_size", "layout_version")


class KVEventMetrics:
    """`journal` is read at scrape time (sizes); a private registry when none is given (tests)."""

    def __init__(self, registry, journal):
        r = registry if registry is not None else CollectorRegistry()
        p = "pdorch_kv_events_"
        self.batches = Counter(p + "batches", "Batches published (deltas and heartbeats; snapshots are "
                               "counted apart)", registry=r)
        self.events = Counter(p + "published", "Page hashes published in batches, by kind", ["kind"], registry=r)
        self.snapshots = Counter(p + "snapshots", "Subscriptions that began with a snapshot", registry=r)
        self.resumes = Counter(p + "resumes", "Subscriptions that resumed from the journal (their epoch and "
                               "after_seq still held)", registry=r)
        self.dropped = Counter(p + "subscribers_dropped", "Subscribers whose stream the worker ended, by reason "
                               "(slow: its queue of batches was full; overflow: the changes pending between two "
                               "batches overflowed, every subscriber resyncs)", ["reason"], registry=r)
        self.refused = Counter(p + "refused", "Subscriptions refused, by the field that did not match",
                               ["field"], registry=r)
        subscribers = Gauge(p + "subscribers", "Open KV event subscriptions (WatchKV streams)", registry=r)
        subscribers.set_function(journal.num_subscribers)
        held = Gauge(p + "journal_batches", "Recent batches held for resumes", registry=r)
        held.set_function(lambda: journal.num_held()[0])
        held_hashes = Gauge(p + "journal_hashes", "Page hashes in the batches held for resumes", registry=r)
        held_hashes.set_function(lambda: journal.num_held()[1])
        pages = Gauge(p + "pages", "Page hashes a snapshot would carry, by tier (l1, store)", ["tier"], registry=r)
        pages.labels("l1").set_function(lambda: journal.num_pages()[0])
        pages.labels("store").set_function(lambda: journal.num_pages()[1])
        for kind in KINDS:
            self.events.labels(kind)
        for reason in DROP_REASONS:
            self.dropped.labels(reason)
        for field in FIELDS:
            self.refused.labels(field)

    def published(self, batch) -> None:
        self.batches.inc()
        for kind in KINDS:
            n = len(getattr(batch, kind))
            if n:
                self.events.labels(kind).inc(n)
