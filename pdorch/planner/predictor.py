"""Next interval's load from the last ones.

`Predictor` is the seam: anything with `observe(load)` and `predict() -> Load | None` plugs into the runner
(a seasonal model, a forecast service). The built-in one, `MovingAverageTrend`, fits a least-squares line to each
quantity over the last `window` intervals and returns the line's value one interval ahead: the moving average plus
the trend (slope x the distance from the window's middle to the next interval). With a window of 1 it is the last
value. Rates and token counts are kept >= 0 and the uncached fraction within [0, 1].
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from pdorch.planner.load import Load


class Predictor(Protocol):
    def observe(self, load: Load) -> None: ...

    def predict(self) -> Load | None:
        """The next interval's load; None before any observation."""
        ...


def linear_forecast(values: list[float]) -> float:
    """The least-squares line through (0, v0) .. (n-1, v_{n-1}) evaluated at n."""
    n = len(values)
    mean = sum(values) / n
    if n == 1:
        return mean
    mid = (n - 1) / 2
    slope = (sum((i - mid) * v for i, v in enumerate(values))
             / sum((i - mid) ** 2 for i in range(n)))
    return mean + slope * (n - mid)


class MovingAverageTrend:
    """Moving average plus linear trend over the last `window` observations."""

    def __init__(self, window: int):
        if window < 1:
            raise ValueError("window must be >= 1")
        self.window = window
        self._history: deque[Load] = deque(maxlen=window)

    def observe(self, load: Load) -> None:
        self._history.append(load)

    def predict(self) -> Load | None:
        if not self._history:
            return None
        h = list(self._history)
        return Load(request_rate=max(0.0, linear_forecast([x.request_rate for x in h])),
                    mean_prompt_tokens=max(0.0, linear_forecast([x.mean_prompt_tokens for x in h])),
                    uncached_fraction=min(1.0, max(0.0, linear_forecast([x.uncached_fraction for x in h]))),
                    mean_output_tokens=max(0.0, linear_forecast([x.mean_output_tokens for x in h])))
