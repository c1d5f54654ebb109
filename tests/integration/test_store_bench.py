"""bench/store_io/run.py runs end to end (tiny sizes) and its last line is the promised JSON object."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_store_io_bench_smoke():
    out = subprocess.run([sys.executable, "bench/store_io/run.py", "--runs", "1", "--seconds", "0.3", "--pages", "8",
                          "--batch", "4", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    res = json.loads(lines[-1])
    for key in ("raw_gbps", "client_idle_gbps", "client_inproc_load_gbps", "raw_outproc_load_gbps", "gil_ratio",
                "loop_slowdown_ratio", "per_page_baseline_gbps"):
        assert isinstance(res[key], float), key
    for key in ("raw_gbps", "client_idle_gbps", "client_inproc_load_gbps", "raw_outproc_load_gbps",
                "per_page_baseline_gbps"):
        assert res[key] > 0, key
    assert res["gil_ratio"] == res["client_inproc_load_gbps"] / res["raw_outproc_load_gbps"]
    assert any(line.startswith("(3) store_client load + in-process loop") for line in lines)
