"""actuator external: the desired replicas as Prometheus gauges, for operators who keep scaling in their hands.

`apply` sets pdorch_planner_external_desired_replicas{role} (on the planner's /metrics), which a KEDA
ScaledObject (prometheus trigger) or an HPA on an external metric reads as the replica count to hold. Unlike
pdorch_planner_desired_replicas (every decision, dry-run too) it moves only in `planner.mode: act`, so a dry-run
never scales through it.

`current()` is what the operator last reported through `report_current` (e.g. a caller that reads the
Deployments' status), else the value last applied, else each role's minimum: the planner cannot see what KEDA or
the HPA did with its wish, so without a report it assumes the wish was granted.
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Gauge

from pdorch.planner.actuator import ROLES


class ExternalActuator:
    name = "external"

    def __init__(self, registry: CollectorRegistry, initial: dict[str, int]):
        self._lock = threading.Lock()
        self._desired = dict(initial)
        self._reported: dict[str, int] = {}
        self._gauge = Gauge("pdorch_planner_external_desired_replicas", "Replicas per role the planner asks the "
                            "external scaler (KEDA, HPA) to hold (planner.actuator external, mode act)",
                            ["role"], registry=registry)
        for role in ROLES:
            self._gauge.labels(role).set(self._desired[role])

    def current(self) -> dict[str, int]:
        with self._lock:
            return {role: self._reported.get(role, self._desired[role]) for role in ROLES}

    def apply(self, desired: dict[str, int]) -> None:
        with self._lock:
            self._desired.update(desired)
            self._reported.clear()  # a report older than this wish no longer says what the fleet is
        for role, n in desired.items():
            self._gauge.labels(role).set(n)

    def report_current(self, replicas: dict[str, int]) -> None:
        with self._lock:
            self._reported.update(replicas)
