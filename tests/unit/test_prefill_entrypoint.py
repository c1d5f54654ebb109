"""`python -m prefill_node` / `python -m decode_node`: a bad configuration stops the process at once
with a message naming the key (before any model is loaded)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("module,override,key", [
    ("prefill_node", "prefill.chunk_tokens=zero", "prefill.chunk_tokens"),
    ("decode_node", "decode.kv_watermark=7", "decode.kv_watermark"),
])
def test_bad_override_exits_2_naming_the_key(module, override, key):
    proc = subprocess.run([sys.executable, "-m", module, "--set", override], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)  # the exit code is what we assert
    assert proc.returncode == 2
    assert key in proc.stderr and "invalid configuration" in proc.stderr
