"""bench/autoscale on a tiny input: the output's shape and that the comparison is computed (not the goal)."""

from dataclasses import replace

from bench.autoscale.arrivals import Shape, generate, rate_at
from bench.autoscale.run import compare


def test_bursts_raise_the_rate_and_the_generator_is_seeded():
    shape = replace(Shape(), duration_s=600.0, bursts=1, ramp_s=60.0, hold_s=120.0)
    assert rate_at(shape, 300.0) > 2.5 * rate_at(shape, 10.0)
    assert generate(shape) == generate(shape) and generate(shape) != generate(replace(shape, seed=1))


def test_tiny_comparison_has_every_fixed_fleet_and_the_planner():
    out = compare(replace(Shape(), duration_s=240.0, bursts=1, ramp_s=30.0, hold_s=60.0), max_prefill=2,
                  max_decode=2, interval_s=30.0)
    assert [(f["prefill"], f["decode"]) for f in out["fixed"]] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert out["intervals"] == 8 and out["requests"] > 0
    # a fixed fleet of P + D replicas pays (P + D) x the run's length
    assert out["fixed"][3]["replica_seconds"] == 4 * 30.0 * out["intervals"]
    assert 0.0 <= out["planner"]["slo_met_fraction"] <= 1.0 and out["planner"]["replica_seconds"] > 0
    smallest = out["smallest_fixed_meeting_slo"]
    if smallest is not None:
        assert out["planner_cost_ratio"] == round(out["planner"]["replica_seconds"] / smallest["replica_seconds"], 3)
    assert set(out["goal"]) == {"slo_met_fraction", "cost_ratio", "met"}
