"""The planner's limit on this arrival list: the same decide code fed the true load of the coming intervals.

`Oracle` is a predictor that is told every interval's load in advance (what the requests of that interval are): its
forecast `ahead` intervals on is the truth. Under the runner's upper bound (horizon from the start-up, margin 0) the
planner then sizes each interval's fleet for the load it will really see; what it still misses comes from the
latency model (a p90 within one interval) and the fleet it starts with, not from the forecast.
"""

from __future__ import annotations

from bench.autoscale.arrivals import Request
from pdorch.planner.load import Load
from pdorch.planner.observation import Observation


def true_loads(requests: list[Request], interval_s: float, intervals: int) -> list[Load]:
    per: list[list[Request]] = [[] for _ in range(intervals)]
    for q in requests:
        per[min(intervals - 1, int(q.arrival_s // interval_s))].append(q)
    return [Observation(interval_s, len(b), sum(q.prompt_tokens for q in b), sum(q.output_tokens for q in b),
                        {"device": sum(q.prompt_tokens - q.uncached_tokens for q in b)}).load() for b in per]


class Oracle:
    def __init__(self, loads: list[Load]):
        self.loads = loads
        self.seen = 0

    def observe(self, load: Load) -> None:
        self.seen += 1

    def predict(self, ahead: int = 1) -> Load | None:
        if not self.seen:
            return None
        return self.loads[min(self.seen - 1 + ahead, len(self.loads) - 1)]
