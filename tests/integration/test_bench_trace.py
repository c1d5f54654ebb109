"""`pdorch bench trace` end to end on a real cluster (mooncake_master, workers, router started by
`pdorch serve`) with the tiny random-weights model, on a trace from the generator: the JSON line is
complete, nothing fails, and the hit rate and both ideals are the ones worked out here by hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN_FIELDS = ("name", "sets", "requests", "errors", "prompt_tokens", "cached_tokens", "hit_rate",
              "instant_ideal_hit_rate", "causal_ideal_hit_rate", "hit_over_instant_ideal", "hit_over_causal_ideal",
              "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "itl_p50_s", "itl_p90_s", "itl_p99_s", "slo_met",
              "goodput_rps", "tier_tokens", "error_samples", "bins", "counters")
# One conversation of two turns and one fan-out group of three, spaced out (>= 1.5 s apart):
#   block ids   system prompt 0 1; session turn 0: + 2 3; turn 1: + answer 4 + turn 5;
#               fan-out prefix 0 1 + 6 7 8, members + 9 / + 10 / + 11
#   times (s)   turn 0 at 0; members at 2, 3.5, 5; turn 1 at 0 + 12 x U(0.5, 1.5) >= 6 (seeded)
SPACED = ["--sessions", "1", "--turns", "2", "--system-blocks", "2", "--first-blocks", "2", "--turn-blocks", "1",
          "--answer-blocks", "1", "--output-tokens", "4", "--think-time-s", "12", "--fanout-groups", "1",
          "--fanout-width", "3", "--fanout-prefix-blocks", "3", "--fanout-suffix-blocks", "1",
          "--fanout-window-s", "4.5", "--fanout-start-s", "2", "--fanout-output-tokens", "4"]


def run_bench(cmd: list[str], tmp_path: Path, model_dir: Path) -> dict:
    """`cmd` + the test's flags. NOTE: `python -m pdorch.cli` rather than the installed `pdorch`
    script: from this checkout (cwd), whichever checkout the virtualenv was installed from."""
    sets = [f"model.source={model_dir}", f"model.cache_dir={tmp_path / 'models'}", "model.torch_threads=1"]
    argv = cmd + ["--json", "--plot-dir", str(tmp_path / "plots"),
                  "--log-dir", str(tmp_path / "logs"), "--timeout", "60"] + [a for s in sets for a in ("--set", s)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PDORCH_")}
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=240, env=env, check=False)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def generate(argv: list[str]) -> int:
    """bench/trace/generate.py through its command line (tests/ keeps off bench's modules)."""
    return subprocess.run([sys.executable, "-m", "bench.trace.generate", *argv], cwd=ROOT, timeout=60, check=False).returncode


def test_spaced_trace_reaches_both_ideals(tmp_path, tiny_model_dir):
    trace = tmp_path / "spaced.jsonl"
    assert generate([str(trace), *SPACED]) == 0
    res = run_bench([sys.executable, "-m", "pdorch.cli", "bench", "trace", str(trace)], tmp_path, tiny_model_dir)
    assert (res["bench"], res["format"], res["planned_requests"], res["sessions"]) == ("trace", "mooncake", 5, 2)
    assert res["page_size"] == 16 and res["block_tokens"] == 16 and Path(res["plot"]).is_file()
    [run] = res["runs"]
    assert all(k in run for k in RUN_FIELDS), sorted(set(RUN_FIELDS) - set(run))
    assert run["requests"] == 5 and run["errors"] == 0 and run["error_samples"] == []
    # 16-token blocks = pages; prompts 4, 6, 6, 6, 6 blocks = 448 tokens. Reusable: every page but the
    # one holding the last token, as far as an earlier prompt had it:
    #   turn 0 [0 1 2 3]: nothing before: 0
    #   member [0 1 6 7 8 9]: 0 1 from turn 0: 2 pages; the next two members 0 1 6 7 8 (5 pages, all
    #   it may reuse) from the first: 5 + 5
    #   turn 1 [0 1 2 3 4 5]: turn 0's 0 1 2 3 (its answer's page never filled: 4 tokens, 3 with KV): 4
    # = (0 + 2 + 5 + 5 + 4) x 16 = 256; spaced out, every earlier prefill had ended: causal = instant
    assert run["prompt_tokens"] == 448
    assert run["instant_ideal_hit_rate"] == run["causal_ideal_hit_rate"] == round(256 / 448, 4)
    assert run["cached_tokens"] == 256 and run["hit_rate"] == run["instant_ideal_hit_rate"]
    assert sum(run["tier_tokens"].values()) == 448 and run["tier_tokens"]["computed"] == 448 - 256
    assert run["slo_met"] <= 5 and run["ttft_p50_s"] > 0 and run["bins"][0]["requests"] == 5
    assert run["counters"]["prefill_computed_tokens"] > 0


def test_compare_inflight_runs_the_same_trace_twice(tmp_path, tiny_model_dir):
    # three requests with one 8-block prefix at the same instant, then a fourth 3 s later
    trace = tmp_path / "burst.jsonl"
    assert generate([str(trace), "--system-blocks", "0", "--fanout-groups", "1", "--fanout-width", "3",
                     "--fanout-prefix-blocks", "8", "--fanout-suffix-blocks", "1", "--fanout-window-s", "0",
                     "--fanout-output-tokens", "2", "--sessions", "1", "--turns", "1", "--first-blocks", "8"]) == 0
    res = run_bench([sys.executable, "-m", "bench.trace", str(trace), "--compare-inflight"], tmp_path, tiny_model_dir)
    off, on = res["runs"]
    assert (off["name"], on["name"]) == ("inflight off", "inflight on")
    for key in ("prefill.share_inflight_prefix", "decode.share_inflight_prefix"):
        assert f"{key}=false" in off["sets"] and f"{key}=true" in on["sets"]
    for run in (off, on):
        # 3 x 9 blocks + the session's 8 = 35 pages = 560 tokens; instant: the 2nd and 3rd member reuse
        # the 8 prefix pages (all they may: the 9th holds the last token) = 256
        assert run["errors"] == 0 and run["prompt_tokens"] == 560
        assert run["instant_ideal_hit_rate"] == round(256 / 560, 4)
        assert run["causal_ideal_hit_rate"] <= run["instant_ideal_hit_rate"]
