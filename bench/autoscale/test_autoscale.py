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


def _short_run():
    from bench.autoscale.run import PROFILE_PATH
    from bench.autoscale.world import World
    from pdorch.planner.profile import load_profile
    requests = generate(replace(Shape(), duration_s=180.0, bursts=1, ramp_s=30.0, hold_s=60.0))
    return requests, World(load_profile(PROFILE_PATH))


def test_a_shorter_decision_interval_leaves_a_fixed_fleet_and_the_slo_intervals_as_they_were():
    from bench.autoscale.sim import simulate
    requests, world = _short_run()
    slo = {"ttft": 1.5, "itl": 0.1}
    seen = []

    def record(k, observation, fleet):
        seen.append((k, fleet.now, observation.interval_s, observation.requests))

    whole = simulate(requests, world, lambda *_: None, {"prefill": 1, "decode": 2}, 30.0, 1.0, 30.0, slo)
    thirds = simulate(requests, world, record, {"prefill": 1, "decode": 2}, 30.0, 1.0, 30.0, slo, decide_s=10.0)
    assert thirds == whole and len(whole[0]) == 6
    # the scaler is called every 10 s, each time with that stretch's arrivals, at its end
    assert [(k, now, span) for k, now, span, _ in seen] == [(k, 10.0 * (k + 1), 10.0) for k in range(18)]
    assert sum(n for *_, n in seen) == sum(q.arrival_s < 180.0 for q in requests)
    assert seen[4][3] == sum(40.0 <= q.arrival_s < 50.0 for q in requests)


def test_a_decision_interval_that_does_not_divide_the_slo_interval_is_refused():
    import pytest

    from bench.autoscale.sim import simulate
    requests, world = _short_run()
    with pytest.raises(ValueError, match="must divide the SLO interval"):
        simulate(requests, world, lambda *_: None, {"prefill": 1, "decode": 1}, 30.0, 1.0, 30.0,
                 {"ttft": 1.5, "itl": 0.1}, decide_s=20.0)
