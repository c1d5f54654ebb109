"""The upper bound the planner sizes for (upper_bound.py), on canned series against hand computations."""

import math

import pytest

from pdorch.config_loader import load_config
from pdorch.planner.load import Load
from pdorch.planner.predictor import MovingAverageTrend, linear_forecast
from pdorch.planner.upper_bound import UpperBound, horizon_intervals, predictor_from_config


def at(rate: float) -> Load:
    return Load(rate, 600.0, 0.5, 100.0)


def test_linear_forecast_further_ahead_by_hand():
    assert linear_forecast([1, 2, 3], ahead=2) == pytest.approx(5.0)  # mean 2 + slope 1 x (4 - 1)
    assert linear_forecast([2, 4, 3], ahead=3) == pytest.approx(5.0)  # mean 3 + 0.5 x (5 - 1)
    assert MovingAverageTrend(2).predict(3) is None


def test_horizon_covers_the_next_interval_and_the_start_up():
    assert horizon_intervals(0.0, 30.0) == 1
    assert horizon_intervals(30.0, 30.0) == 2  # a replica asked for now serves from the interval after next
    assert horizon_intervals(31.0, 30.0) == 3
    assert horizon_intervals(120.0, 30.0) == 5


def test_peak_over_the_horizon_plus_k_rms_of_under_forecasts():
    p = UpperBound(MovingAverageTrend(3), horizon=2, k=1.0, window=10)
    assert p.predict() is None
    p.observe(at(1.0))  # nothing forecast yet; the line forecasts 1 next
    p.observe(at(2.0))  # error 2 - 1 = 1; the line through 1, 2 forecasts 3 next
    p.observe(at(3.0))  # error 3 - 3 = 0; forecasts: 4 (next), 5 (the one after)
    assert p.spread() == pytest.approx(math.sqrt(0.5))
    bound = p.predict()
    assert bound.request_rate == pytest.approx(5.0 + math.sqrt(0.5))
    assert bound.mean_prompt_tokens == 600.0 and bound.uncached_fraction == 0.5  # only the rate is bounded
    p.observe(at(2.0))  # over-forecast (4 expected): counts as 0; the line through 2, 3, 2 is flat at 7/3
    assert p.spread() == pytest.approx(math.sqrt(1 / 3))
    assert p.predict().request_rate == pytest.approx(7 / 3 + math.sqrt(1 / 3))


def test_window_keeps_the_last_errors_and_k_zero_is_the_forecast():
    p = UpperBound(MovingAverageTrend(1), horizon=1, k=2.0, window=1)
    for r in (1.0, 5.0, 5.0):  # errors 4, then 0: the window of 1 keeps only the 0
        p.observe(at(r))
    assert p.predict().request_rate == pytest.approx(5.0)
    flat = UpperBound(MovingAverageTrend(1), horizon=3, k=0.0, window=5)
    flat.observe(at(1.0))
    flat.observe(at(4.0))
    assert flat.predict().request_rate == pytest.approx(4.0)
    with pytest.raises(ValueError):
        UpperBound(MovingAverageTrend(1), horizon=0, k=1.0, window=1)


def test_from_config():
    cfg = load_config(None, {"planner.replica_startup_s": "90", "planner.interval_s": "30",
                             "planner.load_margin": "1.5", "planner.error_window": "7"})
    p = predictor_from_config(cfg)
    assert (p.horizon, p.k, p._errors.maxlen) == (4, 1.5, 7)
