"""The moving average plus trend predictor on canned series (expectations by hand)."""

import pytest

from pdorch.planner.load import Load
from pdorch.planner.predictor import MovingAverageTrend, linear_forecast


def feed(window: int, rates, uncached=None) -> Load:
    p = MovingAverageTrend(window)
    for i, r in enumerate(rates):
        p.observe(Load(r, 100.0, uncached[i] if uncached else 0.5, 10.0))
    return p.predict()


def test_linear_forecast_by_hand():
    assert linear_forecast([1, 2, 3]) == pytest.approx(4.0)  # mean 2 + slope 1 x (3 - 1)
    assert linear_forecast([5, 5, 5, 5]) == pytest.approx(5.0)
    assert linear_forecast([2, 4, 3]) == pytest.approx(4.0)  # mean 3, slope (-2 + 3) / 2 = 0.5: 3 + 0.5 x 2
    assert linear_forecast([7]) == 7


def test_window_keeps_the_last_values_only():
    assert feed(3, [100, 1, 2, 3]).request_rate == pytest.approx(4.0)
    assert feed(1, [9, 4]).request_rate == 4


def test_clamps_the_rate():
    assert feed(3, [3, 2, 1]).request_rate == 0.0  # the line says 0 ... and never below it
    assert feed(3, [3, 1.5, 0]).request_rate == 0.0


def test_the_requests_shape_is_the_moving_average_without_a_trend():
    assert feed(3, [1, 1, 1], uncached=[0.8, 0.9, 1.0]).uncached_fraction == pytest.approx(0.9)
    p = MovingAverageTrend(4)
    for out in (600.0, 900.0, 500.0, 300.0):  # a few long streams ending per interval: a noisy mean
        p.observe(Load(1.0, 8.0, 1.0, out))
    assert p.predict().mean_output_tokens == pytest.approx(575.0)  # a line through them would say 250
    assert feed(2, [1, 1]).mean_prompt_tokens == pytest.approx(100.0)


def test_nothing_before_the_first_observation():
    assert MovingAverageTrend(4).predict() is None
    with pytest.raises(ValueError):
        MovingAverageTrend(0)


def test_an_interval_in_which_no_request_ended_keeps_the_shape_before():
    p = MovingAverageTrend(2)
    p.observe(Load(2.0, 8.0, 0.5, 600.0))
    p.observe(Load(0.0, 0.0, 1.0, 0.0))  # its means are 0 tokens over 0 requests
    got = p.predict()
    assert (got.mean_prompt_tokens, got.uncached_fraction, got.mean_output_tokens) == (8.0, 0.5, 600.0)
    assert got.request_rate == 0.0  # the line through 2, 0 says -2: kept >= 0
