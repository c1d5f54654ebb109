"""KVLayout: how every worker of the cluster must hold KV, checked when a worker joins (discovery or
static list) and at every health check.

A prefill worker writes its pages into the decode worker's pool and both read and write the store by
key: a worker with another page size or KV dtype would read or push bytes the others misread
(garbage KV, not an error). The store key's fingerprint already keeps such a worker's store objects
apart; this check keeps it out of the P/D pairs. The expected values come from the router's own
config (the same file the workers read): `model.page_size`, and `model.kv_dtype` resolved as the
workers resolve it (engine/dtypes.py, with the checkpoint's dtype from config.json). Torch-free.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass

from engine.dtypes import resolve_dtypes


@dataclass(frozen=True)
class KVLayout:
    page_size: int
    kv_dtype: str

    @classmethod
    def from_config(cls, model_cfg, model_dir: pathlib.Path | None) -> KVLayout:
        return cls(model_cfg.page_size, resolve_dtypes(model_cfg.dtype, model_cfg.kv_dtype, model_cfg.device,
                                                       _checkpoint_dtype(model_dir)).kv)

    def refusal(self, info) -> str | None:
        """Why a worker answering `info` (WorkerInfo) cannot join, or None."""
        if info.page_size != self.page_size:
            return (f"page_size {info.page_size} differs from the cluster's {self.page_size} (model.page_size): "
                    "its KV pages cannot be exchanged with the other workers'")
        if info.kv_dtype and info.kv_dtype != self.kv_dtype:  # empty: a worker older than the field
            return (f"kv_dtype {info.kv_dtype} differs from the cluster's {self.kv_dtype} (model.kv_dtype, "
                    "auto = model.dtype): its KV pages cannot be exchanged with the other workers'")
        return None


def _checkpoint_dtype(model_dir: pathlib.Path | None) -> str | None:
    try:
        cfg = json.loads((pathlib.Path(model_dir) / "config.json").read_text()) if model_dir else {}
    except (OSError, ValueError):
        return None
    return cfg.get("torch_dtype") or cfg.get("dtype")
