"""Next interval's load from the last ones.

`Predictor` is the seam: anything with `observe(load)` and `predict(ahead=1) -> Load | None` plugs into the runner
(a seasonal model, a forecast service). The built-in one, `MovingAverageTrend`, fits a least-squares line to the
request rate over the last `window` intervals and returns the line's value `ahead` intervals on: the moving average
plus the trend (slope x the distance from the window's middle to that interval), kept >= 0. The requests' shape
(mean prompt and output tokens, uncached fraction) is the moving average alone. With a window of 1 it is the last
value. An interval in which no
request ended says nothing about their shape (its means would be 0 tokens): it counts with a request rate of 0 and
the shape of the interval before. The runner sizes the fleet for
an upper bound of what a predictor says (upper_bound.py), not for the forecast itself.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from pdorch.planner.load import Load


class Predictor(Protocol):
    def observe(self, load: Load) -> None: ...

    def predict(self, ahead: int = 1) -> Load | None:
        """The load `ahead` intervals on (1: the next interval); None before any observation."""
        ...


def linear_forecast(values: list[float], ahead: int = 1) -> float:
    """The least-squares line through (0, v0) .. (n-1, v_{n-1}) evaluated at n - 1 + ahead."""
    n = len(values)
    mean = sum(values) / n
    if n == 1:
        return mean
    mid = (n - 1) / 2
    slope = (sum((i - mid) * v for i, v in enumerate(values))
             / sum((i - mid) ** 2 for i in range(n)))
    return mean + slope * (n - 1 + ahead - mid)


class MovingAverageTrend:
    """Moving average plus linear trend over the last `window` observations."""

    def __init__(self, window: int):
        if window < 1:
            raise ValueError("window must be >= 1")
        self.window = window
        self._history: deque[Load] = deque(maxlen=window)

    def observe(self, load: Load) -> None:
        if load.request_rate == 0 and self._history:
            last = self._history[-1]
            load = Load(0.0, last.mean_prompt_tokens, last.uncached_fraction, last.mean_output_tokens)
        self._history.append(load)

    def predict(self, ahead: int = 1) -> Load | None:
        if not self._history:
            return None
        h = list(self._history)

        def line(values: list[float]) -> float:
            return linear_forecast(values, ahead)

        def mean(values: list[float]) -> float:
            return sum(values) / len(values)

        # NOTE: the trend for the rate only. A request's shape is a mean over the few requests that ended in
        # an interval (2-15 of them): a line through those follows their noise, and a mean output that the
        # line carried from 600 down to 250 tokens put a steady load of long streams at a short context and
        # scaled decode 1 -> 3 for nothing.
        return Load(request_rate=max(0.0, line([x.request_rate for x in h])),
                    mean_prompt_tokens=mean([x.mean_prompt_tokens for x in h]),
                    uncached_fraction=mean([x.uncached_fraction for x in h]),
                    mean_output_tokens=mean([x.mean_output_tokens for x in h]))
