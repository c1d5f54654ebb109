"""Profile -> per-replica capacity, against hand computations (pdorch/planner/capacity.py's model)."""

import json
import math

import pytest

from pdorch.planner.capacity import decode_capacity, itl_at, prefill_capacity
from pdorch.planner.profile import ProfileError, load_profile, save_profile
from tests.unit.planner_fixtures import PROFILE

# L = 1024 (a profile point): alone 0.3 s, 5000 tok/s, S = 1024 / 5000 = 0.2048 s. At rho = 0.5 the M/M/1 p90 wait
# is S ln(5) / 0.5, so this SLO puts rho* at exactly 0.5: 2500 tok/s per replica.
SLO_RHO_HALF = 0.3 + 0.2048 * math.log(5) / 0.5


def test_prefill_capacity_at_a_profile_point():
    cap = prefill_capacity(PROFILE.prefill, 1024, SLO_RHO_HALF)
    assert cap.alone_ttft_s == 0.3 and cap.saturated_tokens_per_s == 5000.0
    assert cap.max_utilization == pytest.approx(0.5, abs=1e-6)
    assert cap.tokens_per_s == pytest.approx(2500.0, abs=0.01)


def test_prefill_interpolates_between_points_and_clamps_outside():
    mid = prefill_capacity(PROFILE.prefill, 640, 10.0)  # halfway between 256 and 1024
    assert mid.alone_ttft_s == pytest.approx(0.2) and mid.saturated_tokens_per_s == pytest.approx(4500.0)
    below = prefill_capacity(PROFILE.prefill, 10, 10.0)
    assert below.alone_ttft_s == 0.1 and below.saturated_tokens_per_s == 4000.0


def test_prefill_slo_edges():
    # SLO == alone TTFT: no queueing allowed beyond rho 0.1 (where the p90 wait is still 0)
    assert prefill_capacity(PROFILE.prefill, 1024, 0.3).tokens_per_s == pytest.approx(500.0, abs=0.01)
    # SLO below what an idle replica does: nothing
    assert prefill_capacity(PROFILE.prefill, 1024, 0.29).tokens_per_s == 0.0


def test_decode_streams_within_itl_at_a_measured_context():
    # context 1024, batch 8..16: itl = 0.04 + 0.005 (b - 8) <= 0.06  ->  b <= 12
    cap = decode_capacity(PROFILE.decode, 1024, 0.06, max_running_requests=64)
    assert cap.streams == 12 and cap.itl_s == pytest.approx(0.06)


def test_decode_interpolates_context_and_caps_batch():
    # context 1536: itl(8) = 0.05, itl(16) = 0.10 -> 0.05 + 0.00625 (b - 8) <= 0.06 -> b = 9, itl 0.05625
    assert itl_at(PROFILE.decode, 8, 1536) == pytest.approx(0.05)
    cap = decode_capacity(PROFILE.decode, 1536, 0.06, max_running_requests=64)
    assert cap.streams == 9 and cap.itl_s == pytest.approx(0.05625)
    assert decode_capacity(PROFILE.decode, 1536, 0.06, max_running_requests=4).streams == 4
    # never beyond the largest batch profiled, however loose the SLO
    assert decode_capacity(PROFILE.decode, 1024, 5.0, max_running_requests=64).streams == 16


def test_decode_slo_below_one_stream():
    cap = decode_capacity(PROFILE.decode, 1024, 0.01, max_running_requests=64)
    assert cap.streams == 0 and cap.itl_s == pytest.approx(0.02)


def test_profile_round_trip_and_errors_name_the_field(tmp_path):
    path = tmp_path / "p.json"
    save_profile(PROFILE, path)
    assert load_profile(path) == PROFILE
    data = json.loads(path.read_text())
    data["decode"][1]["itl_s"] = -1
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match=r"p.json: decode\[1\]: field 'itl_s' must be a positive number"):
        load_profile(path)
    with pytest.raises(ProfileError, match="cannot read"):
        load_profile(tmp_path / "missing.json")
    path.write_text(json.dumps({**data, "version": 2}))
    with pytest.raises(ProfileError, match="'version' must be 1"):
        load_profile(path)
