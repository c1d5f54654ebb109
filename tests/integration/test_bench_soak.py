"""`pdorch bench soak` for 12 s on a real cluster (mooncake_master, workers, router started by
`pdorch serve`) with the tiny random-weights model: conversations start over after 2 rounds, the JSON
line reports RSS per process, no error, no leaked page, an intact pool on both workers, and the second
turns hit the cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_soak_json(tmp_path, tiny_model_dir):
    sets = [f"model.source={tiny_model_dir}", f"model.cache_dir={tmp_path / 'models'}", "model.torch_threads=1"]
    argv = [sys.executable, "-m", "bench.reliability.soak", "--minutes", "0.2", "--request-rate", "2", "--clients", "2",
            "--rounds", "2", "--first-tokens", "40", "--turn-tokens", "30", "--output-tokens", "8",
            "--rss-interval", "1", "--timeout", "60", "--json", "--plot", str(tmp_path / "rss.png"),
            "--log-dir", str(tmp_path / "logs")]
    argv += [a for s in sets for a in ("--set", s)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PDORCH_")}
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=150, env=env, check=False)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["bench"] == "soak" and res["requests"] >= 6
    assert res["errors"] == 0, res["first_errors"]
    assert res["leaked_pages"] == 0 and res["integrity_ok"]
    assert set(res["leaked_by_worker"]) == {"prefill-0", "decode-0"}
    for state in res["pools_end"].values():
        assert state["free_pages"] == state["total_pages"] and state["active_pages"] == 0
    assert {"master", "prefill-0", "decode-0", "router"} <= set(res["rss_mb"])
    for d in res["rss_mb"].values():
        assert d["warm_mb"] > 0 and d["end_mb"] > 0 and d["max_growth"] >= 0 and 0 < d["min_over_warm"] <= 1
    assert res["rss_max_growth"] is not None and len(res["rss_series"]) >= 10
    # conversations of 2 rounds: every second turn carries the first turn + answer, so it hits
    assert 0 < res["hit_rate"] <= res["ideal_hit_rate"] + 1e-9 and len(res["hit_rate_by_window"]) == 6
    # the warm-up and 5 windows after it, each with both evictors' counts read at its edges
    assert [w["warmup"] for w in res["windows"]] == [True] + [False] * 5
    assert all(w["master_evicted"] is not None and w["pdorch_evicted"] is not None for w in res["windows"])
    assert res["master_eviction_share"] is not None and res["worst_hit_over_ideal_after_warmup"] is not None
    assert Path(res["plot"]).is_file()
