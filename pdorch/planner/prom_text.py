"""Prometheus exposition text -> samples, and the math on two scrapes: counter deltas and histogram quantiles."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from prometheus_client.parser import text_string_to_metric_families

Labels = tuple[tuple[str, str], ...]
Samples = dict[tuple[str, Labels], float]  # (sample name, sorted labels) -> value


def parse_samples(text: str) -> Samples:
    """Every sample of an exposition text; raises ValueError on text that is not the exposition format."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def counter_deltas(before: Samples, after: Samples) -> Samples:
    """after - before for every cumulative sample (_total, _count, _sum, _bucket) present in both scrapes.

    A counter that went down was reset (the process restarted): its increase is then its new value, as
    Prometheus's rate() counts it.
    """
    out: Samples = {}
    for key, value in after.items():
        if not key[0].endswith(("_total", "_count", "_sum", "_bucket")) or key not in before:
            continue
        old = before[key]
        out[key] = value - old if value >= old else value
    return out


def total(samples: Mapping, name: str, where: Callable[[dict[str, str]], bool] = lambda labels: True) -> float:
    """The sum of `name`'s samples whose labels pass `where`."""
    return sum(v for (n, labels), v in samples.items() if n == name and where(dict(labels)))


def by_label(samples: Mapping, name: str, label: str) -> dict[str, float]:
    """`name`'s samples summed by one label's value."""
    out: dict[str, float] = {}
    for (n, labels), v in samples.items():
        if n == name:
            key = dict(labels).get(label, "")
            out[key] = out.get(key, 0.0) + v
    return out


def histogram_quantile(q: float, samples: Mapping, name: str) -> float | None:
    """The q-quantile of histogram `name` (its _bucket samples, summed over other labels), interpolated linearly
    within the bucket it falls in as PromQL's histogram_quantile does; None without observations. A quantile in
    the +Inf bucket is the largest finite bound."""
    buckets: dict[float, float] = {}
    for (n, labels), v in samples.items():
        if n == f"{name}_bucket":
            le = float(dict(labels)["le"])
            buckets[le] = buckets.get(le, 0.0) + v
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    count = buckets[bounds[-1]]
    rank = q * count
    lower_bound, lower_count = 0.0, 0.0
    for le in bounds:
        if buckets[le] >= rank:
            if math.isinf(le):
                return lower_bound
            in_bucket = buckets[le] - lower_count
            return lower_bound + (le - lower_bound) * ((rank - lower_count) / in_bucket if in_bucket else 1.0)
        lower_bound, lower_count = le, buckets[le]
    return lower_bound
