"""Load -> replicas per role, bounds, cooldowns, hysteresis: against hand computations."""

import random

import pytest

from pdorch.planner.decide import Decider, SizingParams, size
from pdorch.planner.load import Load
from tests.unit.test_planner_capacity import PROFILE, SLO_RHO_HALF

# 10 req/s of 2048-token prompts, half cached (1024 uncached tokens each), 100 output tokens.
# prefill: 10 x 1024 = 10240 tok/s; 2500 tok/s per replica (rho* 0.5 at L 1024) -> ceil(4.096) = 5
# decode: context 2048 + 100/2 = 2098 (clamped to the profile's 2048): itl 0.06 + 0.0075 (b - 8) <= 0.09 -> 12
#         streams of itl 0.09; Little: 10 x 100 x 0.09 = 90 streams -> ceil(7.5) = 8
LOAD = Load(request_rate=10.0, mean_prompt_tokens=2048, uncached_fraction=0.5, mean_output_tokens=100)


def params(**kw) -> SizingParams:
    base = {"ttft_p90_s": SLO_RHO_HALF, "itl_p90_s": 0.09, "min_replicas": {"prefill": 1, "decode": 1},
                "max_replicas": {"prefill": 10, "decode": 10}, "up_cooldown_s": 0.0, "down_cooldown_s": 0.0,
                "scale_down_utilization": 0.8, "max_running_requests": 64}
    return SizingParams(**{**base, **kw})


def test_sizing_matches_the_hand_computation():
    s = size(LOAD, PROFILE, params())
    assert s.prefill_demand == pytest.approx(10240.0)
    assert s.prefill.tokens_per_s == pytest.approx(2500.0, abs=0.01)
    assert s.decode.streams == 12 and s.decode_demand == pytest.approx(90.0)
    assert (s.needed("prefill"), s.needed("decode")) == (5, 8)


def test_decision_scales_up_to_the_need_with_its_reason():
    d = Decider(PROFILE, params()).decide(LOAD, {"prefill": 1, "decode": 1}, now=0.0)
    assert d.desired == {"prefill": 5, "decode": 8}
    assert d.roles["prefill"].action == "up" and d.roles["decode"].action == "up"
    assert "10240 uncached tok/s" in d.roles["prefill"].reason and "needs 5: up 1 -> 5" in d.roles["prefill"].reason
    assert "90.0 streams" in d.roles["decode"].reason and d.load == LOAD


def test_bounds_clamp_and_flag_the_shortfall_at_max():
    d = Decider(PROFILE, params(max_replicas={"prefill": 3, "decode": 6})).decide(
        LOAD, {"prefill": 3, "decode": 2}, now=0.0)
    assert d.desired == {"prefill": 3, "decode": 6}
    assert d.roles["prefill"].action == "hold" and d.roles["prefill"].short_at_max
    assert d.roles["decode"].short_at_max and d.roles["decode"].needed == 8
    idle = Decider(PROFILE, params(min_replicas={"prefill": 2, "decode": 2})).decide(
        Load(0.0, 2048, 0.5, 100), {"prefill": 5, "decode": 5}, now=0.0)
    assert idle.desired == {"prefill": 2, "decode": 2}  # no load: down to the minimum, not to 0
    outside = Decider(PROFILE, params(max_replicas={"prefill": 4, "decode": 4})).decide(
        None, {"prefill": 7, "decode": 1}, now=0.0)
    assert outside.desired == {"prefill": 4, "decode": 1} and "outside [1, 4]" in outside.reason


def test_slo_no_replica_can_meet_goes_to_max():
    d = Decider(PROFILE, params(ttft_p90_s=0.2, max_replicas={"prefill": 4, "decode": 10})).decide(
        LOAD, {"prefill": 1, "decode": 8}, now=0.0)
    assert d.desired["prefill"] == 4 and "TTFT SLO unreachable" in d.roles["prefill"].reason
    assert d.roles["prefill"].short_at_max


def test_hysteresis_scales_down_only_below_the_utilisation_threshold():
    decider = Decider(PROFILE, params())
    # need 5 (4.096 replicas' worth); at 80%: ceil(10240 / 2000) = 6 -> 6 stay, 7 go down to 6
    six = decider.decide(LOAD, {"prefill": 6, "decode": 8}, now=0.0).roles["prefill"]
    assert (six.action, six.desired) == ("hold", 6) and "would run above 80%" in six.reason
    seven = decider.decide(LOAD, {"prefill": 7, "decode": 8}, now=0.0).roles["prefill"]
    assert (seven.action, seven.desired) == ("down", 6)


def test_cooldowns_up_and_down_separately():
    decider = Decider(PROFILE, params(up_cooldown_s=60.0, down_cooldown_s=300.0))
    assert decider.decide(LOAD, {"prefill": 1, "decode": 8}, now=0.0).desired["prefill"] == 5
    more = Load(20.0, 2048, 0.5, 100)  # needs ceil(8.192) = 9
    held = decider.decide(more, {"prefill": 5, "decode": 8}, now=30.0).roles["prefill"]
    assert held.action == "hold" and "cooldown (30s of 60s)" in held.reason
    assert decider.decide(more, {"prefill": 5, "decode": 8}, now=61.0).desired["prefill"] == 9
    less = Load(2.0, 2048, 0.5, 100)  # 2048 tok/s: needs 1; at 80% ceil(2048 / 2000) = 2
    assert decider.decide(less, {"prefill": 9, "decode": 8}, now=200.0).roles["prefill"].action == "hold"
    assert decider.decide(less, {"prefill": 9, "decode": 8}, now=362.0).desired["prefill"] == 2


def _run_noisy(utilization: float) -> list[str]:
    decider = Decider(PROFILE, params(scale_down_utilization=utilization))
    rng = random.Random(7)
    current = {"prefill": 1, "decode": 1}
    actions = []
    for i in range(200):
        load = Load(10.0 * rng.uniform(0.95, 1.05), 2048, 0.5, 100)  # 3.9 .. 4.3 prefill replicas' worth
        d = decider.decide(load, current, now=float(i))
        actions.append(d.roles["prefill"].action)
        current = d.desired
    return actions


def test_no_flapping_on_a_noisy_flat_series():
    actions = _run_noisy(0.8)
    assert actions[0] == "up" and actions[1:].count("up") + actions.count("down") == 0
    # the same series without the hysteresis margin flaps: what the threshold is for
    assert _run_noisy(1.0).count("down") > 10


def test_an_observed_slo_miss_adds_a_replica_and_blocks_scale_down():
    decider = Decider(PROFILE, params())
    # the profile says 5 prefill replicas are enough, but the interval's TTFT p90 was 2 s: one more
    d = decider.decide(LOAD, {"prefill": 5, "decode": 8}, now=0.0, missed={"prefill": 2.0})
    assert d.desired["prefill"] == 6 and "observed TTFT p90 2.000s is over the SLO: up 5 -> 6" in d.reason
    assert d.desired["decode"] == 8
    at_max = Decider(PROFILE, params(max_replicas={"prefill": 5, "decode": 10})).decide(
        LOAD, {"prefill": 5, "decode": 8}, now=0.0, missed={"prefill": 2.0})
    assert at_max.desired["prefill"] == 5 and at_max.roles["prefill"].short_at_max


def test_scale_up_to_a_target_utilisation_below_one():
    # at 80%: prefill 10240 / (2500 x 0.8) = 5.12 -> 6; decode 90 / (12 x 0.8) = 9.375 -> 10
    d = Decider(PROFILE, params(scale_up_utilization=0.8)).decide(LOAD, {"prefill": 1, "decode": 1}, now=0.0)
    assert d.desired == {"prefill": 6, "decode": 10} and "needs 6: up 1 -> 6" in d.roles["prefill"].reason
    # and no lower: 6 hold (down would go to ceil(10240 / 2000) = 6 as well)
    held = Decider(PROFILE, params(scale_up_utilization=0.8)).decide(LOAD, {"prefill": 6, "decode": 10}, now=0.0)
    assert held.desired == {"prefill": 6, "decode": 10}
    assert {r.action for r in held.roles.values()} == {"hold"}


def test_scale_down_utilisation_may_not_exceed_scale_up():
    with pytest.raises(ValueError, match="scale_down_utilization <= scale_up_utilization"):
        params(scale_up_utilization=0.7, scale_down_utilization=0.8)
