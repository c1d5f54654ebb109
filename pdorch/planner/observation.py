"""One interval's traffic and service as the routers' and workers' metrics tell it (pure: deltas -> numbers).

Metric names are the routers' (router/metrics.py) and the workers' (pdorch/worker/metrics.py):
- requests: pdorch_router_requests_total on the generation routes (every status: the offered load);
- prompt / output tokens: pdorch_router_prompt_tokens_total, pdorch_router_completion_tokens_total, per request.
  NOTE: the router counts a request's prompt (and cached) tokens at its first token, its completion tokens and the
  request itself at its end; so the mean prompt is taken per first token (pdorch_router_ttft_seconds_count), the
  mean output per ended request. Per ended request, the prompt tokens of streams that outlive an interval landed
  in another interval than their count: under long streams the mean prompt swung from 0 to several times the
  real one;
- hit rate by tier: pdorch_router_cached_tokens_total{tier} / prompt tokens;
- TTFT / ITL p90: pdorch_router_ttft_seconds, pdorch_router_inter_token_latency_seconds (bucket deltas);
- in flight: pdorch_router_requests_in_flight; queues, running, pool use: pdorch_{prefill,decode}_queue_depth,
  _running_requests (summed over workers), _pool_usage_ratio (the fullest worker).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pdorch.planner.load import Load
from pdorch.planner.prom_text import Samples, by_label, histogram_quantile, total
from router.metrics import GENERATION_ROUTES

ROLES = ("prefill", "decode")


@dataclass(frozen=True)
class Observation:
    interval_s: float
    requests: float
    prompt_tokens: float
    output_tokens: float
    cached_tokens_by_tier: dict[str, float] = field(default_factory=dict)
    ttft_p90_s: float | None = None
    itl_p90_s: float | None = None
    in_flight: float = 0.0
    first_tokens: float | None = None  # requests whose first token came in the interval; None: not known
    queue_depth: dict[str, float] = field(default_factory=dict)
    running: dict[str, float] = field(default_factory=dict)
    pool_usage: dict[str, float] = field(default_factory=dict)

    @property
    def request_rate(self) -> float:
        return self.requests / self.interval_s

    @property
    def hit_rate(self) -> float:
        return sum(self.cached_tokens_by_tier.values()) / self.prompt_tokens if self.prompt_tokens else 0.0

    def load(self) -> Load:
        per = self.requests or 1.0
        prompts = self.first_tokens if self.first_tokens else per
        return Load(self.request_rate, self.prompt_tokens / prompts, min(1.0, 1.0 - self.hit_rate),
                    self.output_tokens / per)

    def fields(self) -> dict[str, float | None]:
        """Flat numbers for the decision log."""
        out: dict[str, float | None] = {
            "obs_request_rate": round(self.request_rate, 4), "obs_hit_rate": round(self.hit_rate, 4),
            "obs_ttft_p90_s": self.ttft_p90_s, "obs_itl_p90_s": self.itl_p90_s, "obs_in_flight": self.in_flight}
        for name, values in (("queue", self.queue_depth), ("running", self.running), ("pool", self.pool_usage)):
            out.update({f"obs_{role}_{name}": v for role, v in values.items()})
        return out


def is_generation(labels: dict[str, str]) -> bool:
    return labels.get("route") in GENERATION_ROUTES


def observation_from(deltas: Samples, gauges: list[Samples], interval_s: float) -> Observation:
    """`deltas`: the counters' increases over the interval, summed over every scraped process; `gauges`: each
    process's last scrape."""
    tiers = by_label(deltas, "pdorch_router_cached_tokens_total", "tier")
    queue, running, pool = {}, {}, {}
    for role in ROLES:
        for out, suffix, combine in ((queue, "queue_depth", sum), (running, "running_requests", sum),
                                     (pool, "pool_usage_ratio", max)):
            values = [v for g in gauges for (n, _), v in g.items() if n == f"pdorch_{role}_{suffix}"]
            if values:
                out[role] = combine(values)
    return Observation(
        interval_s=interval_s,
        requests=total(deltas, "pdorch_router_requests_total", is_generation),
        prompt_tokens=total(deltas, "pdorch_router_prompt_tokens_total"),
        output_tokens=total(deltas, "pdorch_router_completion_tokens_total"),
        cached_tokens_by_tier={t: v for t, v in tiers.items() if t},
        ttft_p90_s=histogram_quantile(0.9, deltas, "pdorch_router_ttft_seconds"),
        itl_p90_s=histogram_quantile(0.9, deltas, "pdorch_router_inter_token_latency_seconds"),
        in_flight=sum(total(g, "pdorch_router_requests_in_flight") for g in gauges),
        first_tokens=total(deltas, "pdorch_router_ttft_seconds_count"),
        queue_depth=queue, running=running, pool_usage=pool)
