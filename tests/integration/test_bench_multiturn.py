"""`pdorch bench multiturn` end to end on a real cluster (mooncake_master, workers, router started by
`pdorch serve`) with the tiny random-weights model: 2 clients x 3 rounds; the JSON line is complete
and its ideals are the ones computed here from what the workload sends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROUND_FIELDS = ("round", "requests", "failed", "prompt_tokens", "cached_tokens", "hit_rate", "ideal_hit_rate",
                "capacity_ideal_hit_rate", "ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "itl_p50_s", "itl_p90_s",
                "input_tok_s", "output_tok_s", "tier_tokens", "store_pages_read", "store_pages_written",
                "store_pages_evicted", "store_save_dropped_pages", "store_load_miss_pages", "rss_mb")
RUN_FIELDS = ("worst_hit_over_ideal", "worst_hit_over_capacity_ideal", "ttft_last_over_round1", "rss_growth_ratio")


def run_bench(argv: list[str], tmp_path: Path, model_dir: Path) -> dict:
    sets = [f"model.source={model_dir}", f"model.cache_dir={tmp_path / 'models'}", "model.torch_threads=1"]
    argv = argv + ["--clients", "2", "--rounds", "3", "--first-tokens", "40", "--turn-tokens", "30",
                   "--output-tokens", "8", "--json", "--plot-dir", str(tmp_path / "plots"),
                   "--log-dir", str(tmp_path / "logs"), "--timeout", "60"]
    argv += [a for s in sets for a in ("--set", s)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PDORCH_")}
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=150, env=env, check=False)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_sglang_rounds_json_and_ideals(tmp_path, tiny_model_dir):
    res = run_bench([sys.executable, "-m", "bench.multiturn", "--api", "sglang", "--preset", "l3"], tmp_path,
                    tiny_model_dir)
    rounds = res["rounds"]
    assert [r["round"] for r in rounds] == [0, 1, 2]
    for r in rounds:
        assert all(k in r for k in ROUND_FIELDS), sorted(set(ROUND_FIELDS) - set(r))
        assert r["requests"] == 2 and r["failed"] == 0
        assert sum(r["tier_tokens"].values()) == r["prompt_tokens"]
        assert {"master", "prefill-0", "decode-0", "router"} <= set(r["rss_mb"])
        assert r["ttft_mean_s"] > 0 and r["store_pages_evicted"] == 0
    assert all(k in res for k in RUN_FIELDS)
    # What was sent, per client: round r = 40 + r x (8 answer + 30 turn) ids: 40, 78, 116.
    # Ideal: previous KV (prompt + answer - 1) floored to 16-token pages, never the last token's page:
    #   round 1: min(47 -> 32, (78 - 1) // 16 * 16 = 64) = 32;  round 2: min(85 -> 80, 112) = 80
    assert [r["prompt_tokens"] for r in rounds] == [80, 156, 232]
    assert [r["ideal_tokens"] for r in rounds] == [0, 64, 160]
    assert rounds[1]["ideal_hit_rate"] == round(32 / 78, 4) and rounds[2]["ideal_hit_rate"] == round(80 / 116, 4)
    # the l3 preset's store holds everything: the capacity bound is the ideal itself
    assert [r["capacity_ideal_hit_rate"] for r in rounds] == [r["ideal_hit_rate"] for r in rounds]
    assert rounds[2]["store_pages_written"] > 0
    assert Path(res["plot"]).is_file()


def test_openai_through_the_pdorch_command(tmp_path, tiny_model_dir):
    script = Path(sys.executable).parent / "pdorch"
    cmd = [str(script)] if script.is_file() else [sys.executable, "-m", "pdorch.cli"]
    res = run_bench(cmd + ["bench", "multiturn", "--api", "openai", "--preset", "fits"], tmp_path, tiny_model_dir)
    rounds = res["rounds"]
    assert res["api"] == "openai" and len(rounds) == 3 and res["prompt_token_mismatches"] == 0
    for r in rounds:
        assert all(k in r for k in ROUND_FIELDS) and r["failed"] == 0
        # the OpenAI usage carries pdorch's per-tier split (prompt_tokens_details.cached_tokens_details)
        assert r["tier_source"] == "responses" and sum(r["tier_tokens"].values()) == r["prompt_tokens"]
        assert 0 <= r["ideal_tokens"] <= r["prompt_tokens"]
    assert rounds[0]["ideal_tokens"] == 0 and rounds[2]["ideal_tokens"] > rounds[1]["ideal_tokens"] > 0


def test_sweep_of_one_shape(tmp_path, tiny_model_dir):
    res = run_bench([sys.executable, "-m", "bench.multiturn", "--sweep", "--shapes", "c4-t64-l1x1-s0.3"], tmp_path,
                    tiny_model_dir)
    assert res["bench"] == "multiturn_sweep" and [s["shape"] for s in res["shapes"]] == ["c4-t64-l1x1-s0.3"]
    shape = res["shapes"][0]
    # 4 clients, 64-token turns and first turns, 16-token answers, 3 rounds: the last prompt is
    # 64 + 2 x (16 + 64) = 224 tokens = 14 pages, and the L1 is one of them
    assert (shape["clients"], shape["turn_tokens"], shape["output_tokens"], shape["l1_pages"]) == (4, 64, 16, 14)
    assert shape["store_capacity_mib"] == 32.0  # the 16 MiB floor on both segments (tiny pages)
    assert [r["round"] for r in shape["rounds"]] == [0, 1, 2] and shape["failed_requests"] == 0
    for r in shape["rounds"][1:]:
        assert 0 < r["free_l1_capacity_ideal_hit_rate"] <= r["ideal_hit_rate"]
        assert set(r["reads"]) == {"prefill_l1", "prefill_from_decode", "prefill_store", "decode_l1", "decode_store"}
    assert shape["worst_hit_over_free_l1_capacity_ideal"] is not None
    assert res["worst_hit_over_free_l1_capacity_ideal"] == shape["worst_hit_over_free_l1_capacity_ideal"]
    assert shape["store_pages_evicted"] is not None and shape["store_pages_evicted_by_pdorch"] is not None
