"""bench/gpu_check/run.py gets one run on a GPU machine: a check that raises is reported as failed and
loses only itself, never the entries finished before it or the ones after."""

from bench.gpu_check import correctness
from bench.gpu_check.run import report


def test_a_correctness_entry_that_raises_fails_alone(monkeypatch):
    real = correctness.check_family

    def qwen2_raises(family, *args, **kw):
        if family == "qwen2":
            raise RuntimeError("kernel launch failed")
        return real(family, *args, **kw)

    monkeypatch.setattr(correctness, "check_family", qwen2_raises)
    entries = correctness.run_correctness("cpu", ("float32",))
    assert [(e["family"], "error" in e) for e in entries] == [("llama3", False), ("qwen2", True), ("qwen3", False)]
    assert "kernel launch failed" in entries[1]["error"]
    assert correctness.passed(entries[0]) and not correctness.passed(entries[1]) and correctness.passed(entries[2])


def test_the_report_prints_what_raised(capsys):
    res = {"env": {"device": "cuda", "torch": "2.11", "transformers": "5.17"}, "commit": "abc", "elapsed_s": 1.0,
           "kernels": {"fused": [{"op": "rotary_store", "dtype": "bfloat16", "error": "ValueError: x", "ok": False}],
                       "grid": [{"kernel": "paged_decode", "dtype": "bfloat16", "error": "boom", "ok": False}]},
           "correctness": [{"family": "llama3", "dtype": "bfloat16", "ops": "triton", "error": "Traceback\nRuntimeError: y"}],
           "speed": {"shape": "Llama-3.1-8B", "copy_gbps": 4000.0, "weights_gb_per_step": 16.0, "first_call_extra_s": {},
                     "prefill_attention_ops": [], "prefill": [], "decode": [], "profile_at": [32, 4096],
                     "profile_error": "CUPTI"},
           "targets": {}}
    report(res)
    out = capsys.readouterr().out
    assert "fused rotary_store bfloat16: raised ValueError: x FAILED" in out
    assert "kernel grid bfloat16: every case raised" in out
    assert "llama3  bfloat16 triton raised: RuntimeError: y" in out
