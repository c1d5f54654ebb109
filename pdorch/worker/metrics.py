"""WorkerRecorder: the counters behind a worker's Stats RPC and its Prometheus /metrics.

One object per worker process, with its own CollectorRegistry (tests run several workers in one
interpreter without name clashes). Every method updates the plain counter read by Stats and the
matching Prometheus metric, so the two never disagree. Torch-free.
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from pdorch.worker.prefill_rpc import CACHE_TIERS


class WorkerRecorder:
    def __init__(self, role: str):
        self.role = role
        self.registry = CollectorRegistry()
        self._lock = threading.Lock()
        self.requests_finished = 0
        self.requests_failed = 0
        self.requests_aborted = 0
        self.prompt_tokens_computed = 0
        self.cached = dict.fromkeys(CACHE_TIERS, 0)
        self.generated_tokens = 0
        self.store_pages_written = 0
        self.store_pages_loaded = 0
        self.transfer_bytes = 0
        ns = f"pdorch_{role}"
        r = self.registry
        self._queue = Gauge(f"{ns}_queue_depth", "Requests waiting for admission or pages", registry=r)
        self._running = Gauge(f"{ns}_running_requests", "Requests being prefilled or decoded", registry=r)
        self._pool_used = Gauge(f"{ns}_pool_used_pages", "KV pool pages referenced by requests", registry=r)
        self._pool_total = Gauge(f"{ns}_pool_total_pages", "KV pool pages", registry=r)
        self._pool_usage = Gauge(f"{ns}_pool_usage_ratio", "Referenced pages / total pages", registry=r)
        self._requests = Counter(f"{ns}_requests", "Requests by outcome", ["outcome"], registry=r)
        self._prompt_tokens = Counter(f"{ns}_prompt_tokens", "Prompt tokens by source: computed or the "
                                      "cache tier they were reused from", ["source"], registry=r)
        self._generated = Counter(f"{ns}_generated_tokens", "Tokens generated", registry=r)
        self._store_written = Counter(f"{ns}_store_pages_written", "Pages written to the store "
                                      "(writeback = prompt pages computed here, offload = generated pages)", ["kind"], registry=r)
        self._store_policy = Counter(f"{ns}_store_policy_written_pages", "Pages the store took, by why they "
                                     "were written (store.write_policy): computed = at compute time, "
                                     "selective = at the use the policy asked for, evict = as L1 gave them up, "
                                     "backfill = an L1 hit or a page read from the decode worker the store "
                                     "lacked, generated = decode offload, restore = written again after a master "
                                     "leader switch lost them, drain = written back as the worker drained", ["reason"], registry=r)
        for reason in ("computed", "backfill", "selective", "evict", "restore", "drain") if role == "prefill" else ("computed", "generated", "drain"):
            self._store_policy.labels(reason)  # zeros from the start
        self._store_loaded = Counter(f"{ns}_store_pages_loaded", "Pages read from the store", registry=r)
        self._transfer_bytes = Counter(f"{ns}_transfer_bytes", "Bytes pushed P->D", registry=r)
        self._transfer_s = Histogram(f"{ns}_transfer_seconds", "P->D push latency per request", registry=r,
                                     buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))

    def serve(self, port: int, host: str = "0.0.0.0"):
        """Start the /metrics HTTP server (a daemon thread); returns (server, thread)."""
        return start_http_server(port, addr=host, registry=self.registry)

    def bind_load(self, load_fn, total_pages: int) -> None:
        """Gauges read `load_fn()` (a WorkerLoad) at scrape time, so they are never stale."""
        self._queue.set_function(lambda: load_fn().queued)
        self._running.set_function(lambda: load_fn().running)
        self._pool_used.set_function(lambda: load_fn().active_pages)
        self._pool_total.set(total_pages)
        self._pool_usage.set_function(lambda: load_fn().active_pages / total_pages)

    def request_finished(self) -> None:
        with self._lock:
            self.requests_finished += 1
        self._requests.labels("finished").inc()

    def request_failed(self, aborted: bool) -> None:
        with self._lock:
            self.requests_failed += 1
            self.requests_aborted += int(aborted)
        self._requests.labels("aborted" if aborted else "failed").inc()

    def prompt_tokens(self, computed: int, cached) -> None:
        with self._lock:
            self.prompt_tokens_computed += computed
            for tier in CACHE_TIERS:
                self.cached[tier] += getattr(cached, tier)
        self._prompt_tokens.labels("computed").inc(computed)
        for tier in CACHE_TIERS:
            self._prompt_tokens.labels(tier).inc(getattr(cached, tier))

    def generated(self, n: int) -> None:
        with self._lock:
            self.generated_tokens += n
        self._generated.inc(n)

    def count_store_written(self, n: int, kind: str) -> None:
        with self._lock:
            self.store_pages_written += n
        self._store_written.labels(kind).inc(n)

    def count_written_by_reason(self, pages_by_reason) -> None:
        """`pages_by_reason`: reason -> pages the store took (see `_store_policy`)."""
        for reason, n in pages_by_reason.items():
            self._store_policy.labels(reason).inc(n)

    def count_store_loaded(self, n: int) -> None:
        with self._lock:
            self.store_pages_loaded += n
        self._store_loaded.inc(n)

    def transfer(self, nbytes: int, seconds: float) -> None:
        with self._lock:
            self.transfer_bytes += nbytes
        self._transfer_bytes.inc(nbytes)
        self._transfer_s.observe(seconds)
