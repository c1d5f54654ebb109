"""The router imports these engine modules: they must not pull in torch."""

import subprocess
import sys


def test_torch_free_engine_modules():
    code = ("import sys, engine.arch, engine.prepare, engine.gguf_convert, engine.tokenizer, "
            "engine.sampling_params, engine.stop, engine.sequence; "
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
