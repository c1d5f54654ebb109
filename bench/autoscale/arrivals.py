"""A bursty arrival shape with a fixed seed (no public trace's arrival times are in the repository).

The rate (requests/s) over the run is a base load on a slow wave (one period over the run, 0.5x to 1.5x of
`base_rps`) plus `bursts` bursts at `burst_factor` x base, each ramping up over `ramp_s`, holding for `hold_s`
and ramping down over `ramp_s`, placed at evenly spread start times. Arrivals are a Poisson process of that rate
(thinning). Each request: a prompt of lognormal length (median `prompt_median` tokens, clipped to 32..4096), a
cached fraction uniform in [0, 2 x mean_hit] (clipped to [0, 0.95]), an output of lognormal length (median
`output_median`, 8..1024).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    duration_s: float = 3600.0
    base_rps: float = 1.5
    bursts: int = 3
    burst_factor: float = 3.5
    ramp_s: float = 120.0
    hold_s: float = 300.0
    prompt_median: float = 600.0
    output_median: float = 120.0
    mean_hit: float = 0.4
    seed: int = 52


@dataclass(frozen=True)
class Request:
    arrival_s: float
    prompt_tokens: int
    uncached_tokens: int
    output_tokens: int


def rate_at(shape: Shape, t: float) -> float:
    wave = 1.0 + 0.5 * math.sin(2 * math.pi * t / shape.duration_s)
    extra = 0.0
    for i in range(shape.bursts):
        start = shape.duration_s * (i + 0.5) / shape.bursts - shape.hold_s / 2 - shape.ramp_s
        x = t - start
        up = min(1.0, max(0.0, x / shape.ramp_s))
        down = min(1.0, max(0.0, (x - shape.ramp_s - shape.hold_s) / shape.ramp_s))
        extra = max(extra, up - down)
    return shape.base_rps * (wave + extra * (shape.burst_factor - 1.0))


def generate(shape: Shape) -> list[Request]:
    rng = random.Random(shape.seed)
    peak = shape.base_rps * (1.5 + shape.burst_factor)
    out, t = [], 0.0
    while True:
        t += rng.expovariate(peak)
        if t >= shape.duration_s:
            return out
        if rng.random() * peak > rate_at(shape, t):
            continue
        prompt = int(min(4096, max(32, rng.lognormvariate(math.log(shape.prompt_median), 0.6))))
        hit = min(0.95, max(0.0, rng.uniform(0.0, 2 * shape.mean_hit)))
        output = int(min(1024, max(8, rng.lognormvariate(math.log(shape.output_median), 0.5))))
        out.append(Request(t, prompt, max(1, round(prompt * (1 - hit))), output))
