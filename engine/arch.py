"""ModelArch: the architecture facts of a model, read from an HF `config.json`.

What differs per family (biases, q/k norms, sliding window, ...) comes from the table in
engine/families.py; this file reads the shapes and RoPE. Torch-free (the router imports it).
Accepts both config styles: the classic `rope_theta` + `rope_scaling` keys and the newer
`rope_parameters` dict, and both `torch_dtype` and the newer `dtype` for the checkpoint's dtype.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass, field
from typing import Any

from engine.families import UnsupportedConfig, family_of

SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")


class ModelDirError(ValueError):
    """A model directory is missing a file or holds a config we cannot serve."""


@dataclass(frozen=True)
class ModelArch:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False, compare=True)
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    family: str = "llama"
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    checkpoint_dtype: str | None = None  # config.json's torch_dtype / dtype ("bfloat16", ...), if it says

    @property
    def kv_values_per_token(self) -> int:
        """K and V values one token occupies across all layers (the unit of KV memory)."""
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> ModelArch:
        try:
            fam = family_of(cfg)
        except UnsupportedConfig as e:
            raise ModelDirError(f"config.json {e}") from None
        try:
            hidden = int(cfg["hidden_size"])
            heads = int(cfg["num_attention_heads"])
            arch = cls(
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=int(cfg["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                rope_theta=float(_rope_theta(cfg)),
                rope_scaling=_rope_scaling(cfg),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
                max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", fam.tie_default)),
                bos_token_id=cfg.get("bos_token_id"),
                eos_token_ids=_as_ids(cfg.get("eos_token_id")),
                family=fam.name,
                qkv_bias=fam.feature(fam.qkv_bias, cfg),
                o_bias=fam.feature(fam.o_bias, cfg),
                mlp_bias=fam.feature(fam.mlp_bias, cfg),
                qk_norm=fam.qk_norm,
                checkpoint_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
            )
        except KeyError as e:
            raise ModelDirError(f"config.json lacks required key {e.args[0]!r}") from None
        if arch.num_heads % arch.num_kv_heads:
            raise ModelDirError(f"num_attention_heads={arch.num_heads} is not a multiple of "
                                f"num_key_value_heads={arch.num_kv_heads}")
        return arch

    @classmethod
    def from_model_dir(cls, model_dir: str | pathlib.Path) -> ModelArch:
        path = pathlib.Path(model_dir) / "config.json"
        if not path.is_file():
            raise ModelDirError(f"{path} not found: not a prepared model directory (run `pdorch model prepare`)")
        arch = cls.from_config(json.loads(path.read_text()))
        # generation_config.json may list more stop ids than config.json (e.g. Llama 3 instruct).
        gen = pathlib.Path(model_dir) / "generation_config.json"
        if gen.is_file():
            extra = _as_ids(json.loads(gen.read_text()).get("eos_token_id"))
            ids = tuple(dict.fromkeys(arch.eos_token_ids + extra))
            arch = cls(**{**arch.__dict__, "eos_token_ids": ids})
        return arch


def _as_ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _rope_theta(cfg: dict[str, Any]) -> float:
    params = cfg.get("rope_parameters") or {}
    return params.get("rope_theta") or cfg.get("rope_theta") or 10000.0


def _rope_scaling(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The scaling dict without the theta, or None for plain RoPE; rejects types we do not implement."""
    scaling = dict(cfg.get("rope_scaling") or cfg.get("rope_parameters") or {})
    scaling.pop("rope_theta", None)
    rope_type = scaling.pop("rope_type", None) or scaling.pop("type", None) or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ModelDirError(f"rope scaling type {rope_type!r} is not supported (supported: {SUPPORTED_ROPE_TYPES})")
    if rope_type == "default":
        return None
    if rope_type in ("llama3", "yarn"):
        scaling.setdefault("original_max_position_embeddings",
                           cfg.get("original_max_position_embeddings", cfg.get("max_position_embeddings", 2048)))
    return {"rope_type": rope_type, **scaling}


def llama_config(*, vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim,
                 rope_theta, rms_norm_eps, max_position_embeddings, tie, bos, eos, pad) -> dict:
    """An HF `config.json` dict for a plain Llama (loadable by transformers as well as by us)."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab_size,
        "hidden_size": hidden_size, "intermediate_size": intermediate_size, "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads, "num_key_value_heads": num_kv_heads, "head_dim": head_dim,
        "hidden_act": "silu", "max_position_embeddings": max_position_embeddings, "rms_norm_eps": rms_norm_eps,
        "rope_theta": rope_theta, "rope_scaling": None, "tie_word_embeddings": tie, "attention_bias": False,
        "mlp_bias": False, "bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad,
        "torch_dtype": "float32",
    }
