"""bench/router_overhead/pick.py on a small fleet: every step of the router's choice is timed, and the run
routes over every worker it was given."""

from __future__ import annotations

from bench.router_overhead.pick import STEPS, run


def test_small_run_reports_each_step():
    res = run(workers=6, decisions=300, warmup=50)
    assert res["workers_per_role"] == 6 and res["decisions"] == 300
    for step in (*STEPS, "total"):
        assert 0 < res[f"{step}_p50_us"] <= res[f"{step}_p99_us"]
    assert res["total_p50_us"] >= res["choose_p50_us"]
