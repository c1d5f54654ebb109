"""What a benchmark run records about itself and the model it loads: the commit it ran at, the
served model's tokenizer and KV shape, the random test checkpoint it may serve. The multi-turn
benchmark and the benchmarks built on its pieces (long context, soak, overload, failover, ...)
share these, so their JSON lines name the same things the same way.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from pdorch.local_stack.hf_checkpoints import build_checkpoint

ROOT = Path(__file__).resolve().parents[2]


def commit() -> str:
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], check=False,
                              capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "-uno"], check=False,
                               capture_output=True,
                               text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return head + ("+dirty" if dirty else "") if head else "unknown"


def test_model_dir(family: str) -> Path:
    """The random `family` checkpoint of pdorch/local_stack/hf_checkpoints.py, built once (seed 0, tiny shape)."""
    out = Path(os.path.expanduser("~/.cache/pdorch/test-models")) / family
    if not (out / "config.json").is_file():
        tmp = out.with_name(f".{family}.tmp-{os.getpid()}")
        build_checkpoint(family, tmp)
        os.replace(tmp, out)
    return out


def model_facts(url: str | None, cfg):
    """(tokenizer, model dir, kv values per token, page size, model name) of the served model."""
    from engine.arch import ModelArch
    from engine.tokenizer import Tokenizer
    if url:
        import httpx
        info = httpx.get(url.rstrip("/") + "/server_info", timeout=30).json()
        model_dir, page, name = Path(info["model_path"]), int(info["page_size"]), info["model"]
    else:
        from engine.prepare import prepare_model
        model_dir = prepare_model(cfg.model.source, cfg.model.cache_dir, progress=lambda m: None)
        page, name = cfg.model.page_size, cfg.model.served_name
    arch = ModelArch.from_model_dir(model_dir)
    return Tokenizer.from_dir(model_dir), model_dir, arch.kv_values_per_token, page, name
