"""`pdorch bench profile` end to end on a real cluster (mooncake_master, one prefill and one decode worker,
router, started by `pdorch serve`) with the tiny random-weights model: two points per role, two runs each.
The file has exactly the planner's fields and the asked grid; of the numbers only what must hold on a
noisy machine is asserted (positive, finite, within the request deadline); no ordering between points."""

from __future__ import annotations

import datetime
import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_profile(tmp_path: Path, model_dir: Path, *flags: str) -> subprocess.CompletedProcess:
    sets = [f"model.source={model_dir}", f"model.cache_dir={tmp_path / 'models'}", "model.torch_threads=1"]
    argv = [sys.executable, "-m", "pdorch.cli", "bench", "profile", "--out", str(tmp_path / "profile.json"),
            "--log-dir", str(tmp_path / "logs"), "--timeout", "60", *flags] + [a for s in sets for a in ("--set", s)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PDORCH_")}
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=240, env=env, check=False)


def test_profile_writes_the_planners_file(tmp_path, tiny_model_dir):
    out = run_profile(tmp_path, tiny_model_dir, "--prompt-tokens", "512,64", "--batches", "1,4", "--contexts", "96",
                      "--runs", "2")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    profile = json.loads((tmp_path / "profile.json").read_text())
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".profile.json")] == []  # no temp file left
    assert set(profile) == {"version", "model", "device", "created", "prefill", "decode"}
    assert (profile["version"], profile["model"], profile["device"]) == (1, tiny_model_dir.name, "cpu")
    created = datetime.datetime.fromisoformat(profile["created"])
    assert created.tzinfo is not None and abs(datetime.datetime.now(datetime.UTC) - created).total_seconds() < 300
    assert [p["prompt_tokens"] for p in profile["prefill"]] == [64, 512]  # sorted, as asked
    assert [(d["batch"], d["context_tokens"]) for d in profile["decode"]] == [(1, 96), (4, 96)]
    for p in profile["prefill"]:
        assert set(p) == {"prompt_tokens", "tokens_per_s", "ttft_s"}
        assert 0 < p["ttft_s"] < 60 and 0 < p["tokens_per_s"] < math.inf
    for d in profile["decode"]:
        assert set(d) == {"batch", "context_tokens", "tokens_per_s", "itl_s"}
        assert 0 < d["itl_s"] < 60 and 0 < d["tokens_per_s"] < math.inf
    assert "wrote" in out.stdout and "2 prefill and 2 decode points" in out.stdout


def test_a_batch_above_the_decode_limit_is_refused_before_starting(tmp_path, tiny_model_dir):
    out = run_profile(tmp_path, tiny_model_dir, "--batches", "8", "--set", "decode.max_running_requests=4")
    assert out.returncode == 2
    assert "decode.max_running_requests=4 is below the largest batch 8" in out.stderr
    assert not (tmp_path / "profile.json").exists() and not (tmp_path / "logs").exists()
