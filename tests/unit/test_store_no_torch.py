"""store_client must never import torch (docs/design.md section 1): the router and small images use it; nor
anything of pdorch (it is a library the workers, the router and tests use on its own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_CHILD = """
import importlib, json, pkgutil, sys
import store_client
names = sorted(m.name for m in pkgutil.iter_modules(store_client.__path__))
for name in names:
    importlib.import_module("store_client." + name)
# The native Mooncake modules that store_client loads lazily must not pull torch in either.
import mooncake.store, mooncake.engine
from store_client.transfer import KVTransfer
KVTransfer().start()
print(json.dumps({"modules": names, "torch": "torch" in sys.modules,
                  "pdorch": sorted(m for m in sys.modules if m == "pdorch" or m.startswith("pdorch."))}))
"""


def test_store_client_imports_no_torch():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=120,
                         cwd=ROOT, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert {"page_hash", "master", "transfer", "store", "io_thread", "metrics", "connector"} <= set(result["modules"])
    assert result["torch"] is False, "a store_client module imported torch"
    assert result["pdorch"] == [], f"store_client imported {result['pdorch']}"
