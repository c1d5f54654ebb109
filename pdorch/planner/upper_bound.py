"""The load the planner sizes for: an upper bound of what the predictor says, not its forecast.

A replica asked for now serves only after it has started, and the forecast is wrong by about its recent errors; a
fleet sized for the forecast itself misses the SLO whenever the load grows faster than one interval's lag (burst
ramps) or lands above the line (noise). `UpperBound` wraps a predictor and returns, for the request rate:

    max(forecast 1 .. horizon intervals ahead) + k x RMS(the last `window` one-interval under-forecasts)

horizon = 1 + ceil(replica start-up / interval): the next interval (the fleet now running serves it) up to the one
in which a replica asked for now first serves. An under-forecast is max(0, observed rate - the rate forecast for that
interval one interval before): a forecast that lags a ramp raises the bound as much as noise does, while
over-forecasts (the line lagging a falling load) do not count: they cost replica-seconds, never the SLO, and
counting them would only keep replicas longer after a burst (bench/autoscale: 0.736x -> 0.713x at the same
attainment). The other quantities (prompt and output lengths, hit rate) are the forecast's for the next interval.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import replace

from pdorch.planner.load import Load
from pdorch.planner.predictor import MovingAverageTrend, Predictor


def horizon_intervals(startup_s: float, interval_s: float) -> int:
    """Intervals ahead a scale-up decided now must cover: the next one and those until a new replica serves."""
    return 1 + math.ceil(startup_s / interval_s - 1e-9)


class UpperBound:
    def __init__(self, base: Predictor, horizon: int, k: float, window: int):
        if horizon < 1 or window < 1 or k < 0:
            raise ValueError("horizon and window must be >= 1, k >= 0")
        self.base = base
        self.horizon = horizon
        self.k = k
        self._errors: deque[float] = deque(maxlen=window)
        self._expected: float | None = None  # the rate forecast for the interval observed next

    def observe(self, load: Load) -> None:
        if self._expected is not None:
            self._errors.append(max(0.0, load.request_rate - self._expected))
        self.base.observe(load)
        nxt = self.base.predict(1)
        self._expected = nxt.request_rate if nxt is not None else None

    def spread(self) -> float:
        """RMS of the recent one-interval under-forecasts of the rate (0 before two observations)."""
        return math.sqrt(sum(e * e for e in self._errors) / len(self._errors)) if self._errors else 0.0

    def predict(self, ahead: int = 1) -> Load | None:
        forecasts = [self.base.predict(h) for h in range(ahead, ahead + self.horizon)]
        if forecasts[0] is None:
            return None
        peak = max(f.request_rate for f in forecasts if f is not None)
        return replace(forecasts[0], request_rate=peak + self.k * self.spread())


def predictor_from_config(cfg) -> UpperBound:
    """The predictor `pdorch planner` runs: moving average plus trend under the upper bound (planner.* keys)."""
    p = cfg.planner
    return UpperBound(MovingAverageTrend(p.predictor_window), horizon_intervals(p.replica_startup_s, p.interval_s),
                      p.load_margin, p.error_window)
