"""The router (and the worker registration helper it shares) must not import torch, nor Mooncake
(clearing the store runs `store_client.clear_all` in a child process)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_router_modules_do_not_import_torch():
    modules = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts) for p in (ROOT / "router").rglob("*.py")
                     if p.stem != "__main__")
    modules += ["router.__main__", "pdorch.worker.registration", "engine.tokenizer", "engine.prepare",
                "store_client.page_hash"]
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules)
            + "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'mooncake'))\n"
            + "print(','.join(bad))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert "router.http.app" in modules and "router.dispatch.dispatch" in modules and "router.grpc.conn" in modules
    assert out.stdout.strip() == "", f"torch or mooncake imported by the router: {out.stdout.strip()}"
