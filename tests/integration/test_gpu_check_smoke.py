"""bench/gpu_check/run.py --smoke on the CPU: the prepared device check runs end to end (tiny shapes), so
the one run it gets on a GPU machine does not fail on a typo. Its correctness part is real here too:
the engine equals transformers token for token in fp32, seeded sampling is reproducible, and the
devices part's TP 2 (over gloo here) gives the greedy tokens of one process."""

import json
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_gpu_check_smoke_runs_end_to_end(tmp_path):
    out = tmp_path / "RESULT.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check" / "run.py"), "--smoke", "--json", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=480, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert json.loads(out.read_text()) == json.loads(json.dumps(res))  # the file holds the final object
    assert list(res["part_s"]) == ["kernels", "correctness", "devices", "speed"]
    assert "needs CUDA" in res["kernels"]["skipped"]  # on CPU the grid runs in the interpreter (unit test)
    assert [(c["family"], c["dtype"]) for c in res["correctness"]] == [("llama3", "float32"), ("qwen2", "float32"),
                                                                     ("qwen3", "float32")]
    for c in res["correctness"]:
        assert c["greedy_equal"] and c["seeded_reproducible"] and c["batch_tokens_equal"], c
        assert c["logits_rel_diff"] <= c["logits_tolerance"], c
        assert c["batch_logits_rel_diff"] <= 1e-4, c
    speed = res["speed"]
    assert [p["prompt_tokens"] for p in speed["prefill"]] == [64, 128]
    assert any("scaled_dot_product" in k for k in speed["prefill_attention_ops"]), speed["prefill_attention_ops"]
    assert [(d["batch"], d["context"]) for d in speed["decode"]] == [(1, 32), (1, 64), (2, 32), (2, 64)]
    assert all(d["ours_wall_s"] > 0 and d["roofline_s"] > 0 and d["hf_wall_s"] > 0 for d in speed["decode"])
    assert len(speed["profile"]) == 10 and speed["copy_gbps"] > 0
    assert set(speed["first_call_extra_s"]) == {"decode", "extend"}
    assert set(res["targets"]) == {"decode_b32_4k_within_1_5x_roofline", "decode_b1_4k_within_1_3x_roofline",
                                   "decode_b128_4k_within_1_3x_roofline", "prefill_8k_at_least_hf"}
    assert "top-10 by device time" in proc.stdout
    placement, tp = res["devices"]["placement"], res["devices"]["tp2"]
    assert placement["device"] == "cpu" and placement["thread_tokens_equal"] and placement["ok"], placement
    # TP 2 over gloo on the CPU: the GPU run's code path (delta steps, gather to rank 0), greedy = one process
    assert tp["devices"] == ["cpu", "cpu"] and tp["greedy_equal"] and tp["logits_rel_diff"] <= 1e-4, tp
    assert tp["tp1_ms"] > 0 and tp["tp2_eager_ms"] > 0 and tp["ok"], tp
    assert res["devices_passed"]


def test_a_killed_run_keeps_the_parts_it_finished(tmp_path):
    """SIGKILL once the correctness part is written: the file holds it (whole JSON, not half written)."""
    out = tmp_path / "RESULT.json"
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "gpu_check" / "run.py"), "--smoke", "--out", str(out)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not (out.exists() and "correctness" in json.loads(out.read_text())):
            assert proc.poll() is None, "the check ended before its correctness part was saved"
            assert time.monotonic() < deadline, "no correctness part saved within 300 s"
            time.sleep(0.2)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    res = json.loads(out.read_text())
    assert len(res["correctness"]) == 3 and "kernels" in res and res["elapsed_s"] > 0
