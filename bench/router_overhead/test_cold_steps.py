"""bench/router_overhead/cold_steps.py on a few calls: every step is timed cold and warm."""

from __future__ import annotations

from bench.router_overhead.cold_steps import measure


def test_every_step_is_timed_cold_and_warm(tmp_path):
    from engine.prepare import make_tiny_model

    result = measure(make_tiny_model(tmp_path), calls=5)
    assert len(result) == 8
    assert all(r["cold_us"] > 0 and r["warm_us"] > 0 for r in result.values())
