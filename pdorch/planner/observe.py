"""The planner's eyes: scrapes the routers' and workers' /metrics over HTTP every interval.

`MetricsObserver.observe()` scrapes every URL (each request with a deadline), keeps each URL's last samples, and
turns the counters' increases since the previous scrape of the same URL into an `Observation` (observation.py).
The first call only primes (returns None). A URL that does not answer is left out of that interval and logged;
its next good scrape is compared with its last good one, so nothing is counted twice. When no router answers, the
interval has no observation (None).
"""

from __future__ import annotations

import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from pdorch.planner.observation import Observation, observation_from
from pdorch.planner.prom_text import Samples, counter_deltas, parse_samples

log = logging.getLogger(__name__)


def fetch_metrics(url: str, timeout_s: float, bearer: str = "") -> str:
    """GET url (a /metrics URL) within timeout_s; raises OSError (URLError, timeout) or ValueError."""
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {bearer}"} if bearer else {})
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return r.read().decode("utf-8", errors="replace")


def metrics_url(base: str) -> str:
    """A router's base URL -> its /metrics URL (a URL already ending in /metrics is kept)."""
    base = base.rstrip("/")
    return base if base.endswith("/metrics") else f"{base}/metrics"


class MetricsObserver:
    def __init__(self, router_urls: list[str], worker_urls: list[str], timeout_s: float, bearer: str = "",
                 clock: Callable[[], float] = time.monotonic,
                 fetch: Callable[[str, float, str], str] = fetch_metrics):
        if not router_urls:
            raise ValueError("at least one router URL is needed")
        self.router_urls = [metrics_url(u) for u in router_urls]
        self.worker_urls = [metrics_url(u) for u in worker_urls]
        self.timeout_s = timeout_s
        self._bearer = bearer
        self._clock = clock
        self._fetch = fetch
        self._last: dict[str, tuple[float, Samples]] = {}  # url -> (when, samples) of its last good scrape

    def observe(self) -> Observation | None:
        deltas: Samples = {}
        gauges: list[Samples] = []
        spans: list[float] = []
        for url in self.router_urls + self.worker_urls:
            now = self._clock()
            samples = self._scrape(url)
            if samples is None:
                continue
            gauges.append(samples)
            previous = self._last.get(url)
            self._last[url] = (now, samples)
            if previous is None:
                continue
            for key, v in counter_deltas(previous[1], samples).items():
                deltas[key] = deltas.get(key, 0.0) + v
            if url in self.router_urls:
                spans.append(now - previous[0])
        if not spans:
            return None
        # NOTE: each router's delta spans its own two scrapes; they are taken back to back, so one interval
        # (their mean) stands for all.
        return observation_from(deltas, gauges, max(1e-3, sum(spans) / len(spans)))

    def _scrape(self, url: str) -> Samples | None:
        try:
            return parse_samples(self._fetch(url, self.timeout_s, self._bearer))
        except (OSError, ValueError) as e:  # URLError and socket timeouts are OSErrors
            log.warning("planner: cannot scrape %s: %s", url, getattr(e, "reason", e))
            return None
