"""bench/routing_sim.py on a small fleet: the precise replicas keep the oracle's hit rate, the
numbers it reports are there and scale with the pages held."""

from __future__ import annotations

import itertools
import json

from bench.routing_sim import main, run
from bench.routing_sim_fleet import SimConfig, make_requests, page_hash

SMALL = SimConfig(workers=20, routers=4, conversations=800, restarts=2, l1_pages=256, store_pages=3000)


def test_workload_is_reproducible_and_prompts_extend():
    a, b = make_requests(SMALL), make_requests(SMALL)
    assert a == b and len(a) > SMALL.conversations
    assert all(x.t <= y.t for x, y in itertools.pairwise(a))
    by_conv: dict[int, list[int]] = {}
    for r in a:
        by_conv.setdefault(r.conv, []).append(r.pages)
    assert all(p == sorted(p) and len(set(p)) == len(p) for p in by_conv.values())
    assert len({page_hash(c, i) for c in range(50) for i in range(64)}) == 50 * 64


def test_small_run_hit_rate_near_the_oracle_and_numbers_scale():
    res = run(SMALL, 1.0, [0.5, 1.0], lambda _: None)
    o, p = res["oracle"], res["precise"]
    assert 0.3 < o["hit_rate"] <= 1.0
    assert 0.85 <= res["precise_over_oracle"] <= 1.1, res["precise_over_oracle"]
    assert res["contrast"]["guess"]["hit_rate"] > 0  # today's policy ran on the same requests
    assert p["decision_us_p99"] > 0 and p["event_bytes_per_s_per_worker"] > 0
    assert p["index"]["speculative_confirmed"] > 0
    # router 0 timed with an index of its own, the other replicas sharing one: same requests, a hit rate near
    rep = res["replica"]
    assert rep["decision_us_p99"] > 0 and rep["apply_us_per_batch"] > 0
    assert 0.85 <= rep["hit_rate"] / o["hit_rate"] <= 1.1
    half, full = res["linearity"]
    assert full["pages_held"] > 1.5 * half["pages_held"]
    assert full["tracemalloc_bytes"] > 1.3 * half["tracemalloc_bytes"]
    assert full["snapshot_bytes_per_worker"] > 1.5 * half["snapshot_bytes_per_worker"]


def test_json_line(capsys):
    assert main(["--workers", "10", "--routers", "2", "--conversations", "200", "--restarts", "1",
                 "--contrast-scale", "1", "--linearity", "", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["workers"] == 10 and out["routers"] == 2 and 0 < out["precise_over_oracle"] <= 1.5
