"""The planner's own Prometheus metrics (names the chart's dashboards and alerts use)."""

from __future__ import annotations

from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge

from pdorch.planner.actuator import ROLES
from pdorch.planner.decide import Decision
from pdorch.planner.observation import Observation


class PlannerMetrics:
    def __init__(self, registry: CollectorRegistry, attainment_window: int):
        r = registry
        self.desired = Gauge("pdorch_planner_desired_replicas", "Replicas per role the last decision wants "
                             "(dry-run too)", ["role"], registry=r)
        self.current = Gauge("pdorch_planner_current_replicas", "Replicas per role the actuator reports (serving "
                             "or starting)", ["role"], registry=r)
        self.decisions = Counter("pdorch_planner_decisions", "Decisions per role by action", ["role", "action"],
                                 registry=r)
        self.attainment = Gauge("pdorch_planner_slo_attainment", "Fraction of the last intervals (with traffic) "
                                "whose observed p90 met the SLO", ["slo"], registry=r)
        self.miss_at_max = Gauge("pdorch_planner_slo_miss_at_max", "1 while the role is at its max replicas and "
                                 "its SLO is missed (observed, or the load needs more)", ["role"], registry=r)
        self.last_decision = Gauge("pdorch_planner_last_decision_timestamp_seconds", "When the last decision was "
                                   "made (unix time)", registry=r)
        for role in ROLES:
            for action in ("up", "down", "hold"):
                self.decisions.labels(role, action)
            self.miss_at_max.labels(role).set(0)
        self._met: dict[str, deque[bool]] = {slo: deque(maxlen=attainment_window) for slo in ("ttft", "itl")}
        for slo in self._met:
            self.attainment.labels(slo).set(1.0)

    def attainment_now(self) -> dict[str, float | None]:
        """{slo: fraction of the last intervals with traffic that met it}; None before any such interval."""
        return {slo: (sum(m) / len(m) if m else None) for slo, m in self._met.items()}

    def record(self, decision: Decision, current: dict[str, int], observed: Observation | None,
               slo_s: dict[str, float], max_replicas: dict[str, int]) -> dict[str, bool]:
        """Update every gauge for one decision; returns {slo: met} for this interval (absent: no traffic)."""
        met: dict[str, bool] = {}
        if observed is not None:
            for slo, p90 in (("ttft", observed.ttft_p90_s), ("itl", observed.itl_p90_s)):
                if p90 is not None:
                    met[slo] = p90 <= slo_s[slo]
                    self._met[slo].append(met[slo])
                    self.attainment.labels(slo).set(sum(self._met[slo]) / len(self._met[slo]))
        for role, d in decision.roles.items():
            slo = "ttft" if role == "prefill" else "itl"
            self.desired.labels(role).set(d.desired)
            self.current.labels(role).set(current[role])
            self.decisions.labels(role, d.action).inc()
            missed = d.short_at_max or (current[role] >= max_replicas[role] and met.get(slo) is False)
            self.miss_at_max.labels(role).set(int(missed))
        self.last_decision.set(decision.at)
        return met
