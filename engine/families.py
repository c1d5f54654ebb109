"""The model families the engine serves, as data: one entry per HF `architectures` name saying what
differs between them, and the config.json keys that ask for something the engine does not implement.

Adding a family is one entry here plus its test (tests/unit/test_engine_families_vs_hf.py). Torch-free.

A feature is either a constant (the family always / never has it) or `Key(name, default)`: the
family reads it from config.json, e.g. Llama's `attention_bias`. What every family shares stays out
of the table: RMSNorm, half-split ("neox") RoPE with the HF `rope_scaling` variants (engine/rope.py),
GQA, a gated MLP, `tie_word_embeddings` read from config.json.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class UnsupportedConfig(ValueError):
    """config.json asks for something the engine does not implement; the message names the key."""


@dataclass(frozen=True)
class Key:
    """A feature read from a config.json key (absent or null: `default`)."""

    name: str
    default: bool = False

    def read(self, cfg: dict[str, Any]) -> bool:
        value = cfg.get(self.name)
        return self.default if value is None else bool(value)


Feature = bool | Key


@dataclass(frozen=True)
class Family:
    name: str
    qkv_bias: Feature          # biases on the q, k and v projections
    o_bias: Feature            # bias on the output projection
    mlp_bias: Feature          # biases on gate, up and down projections
    qk_norm: bool              # per-head RMSNorm on q and k before RoPE (Qwen3)
    tie_default: bool          # tie_word_embeddings when config.json does not say
    window: str                # how config.json asks for sliding-window attention: see _WINDOW_RULES
    activations: tuple[str, ...] = ("silu",)

    def feature(self, feature: Feature, cfg: dict[str, Any]) -> bool:
        return feature.read(cfg) if isinstance(feature, Key) else feature


FAMILIES: dict[str, Family] = {
    "LlamaForCausalLM": Family("llama", qkv_bias=Key("attention_bias"), o_bias=Key("attention_bias"),
                               mlp_bias=Key("mlp_bias"), qk_norm=False, tie_default=False, window="key"),
    "MistralForCausalLM": Family("mistral", qkv_bias=False, o_bias=False, mlp_bias=False, qk_norm=False,
                                 tie_default=False, window="key"),
    # Qwen1.5, Qwen2, Qwen2.5: q/k/v biases, no o bias; sliding_window is set but off unless use_sliding_window.
    "Qwen2ForCausalLM": Family("qwen2", qkv_bias=True, o_bias=False, mlp_bias=False, qk_norm=False,
                               tie_default=False, window="qwen"),
    # Qwen3 dense: q/k RMSNorm per head; attention_bias (false in every released checkpoint) covers q, k, v, o.
    "Qwen3ForCausalLM": Family("qwen3", qkv_bias=Key("attention_bias"), o_bias=Key("attention_bias"),
                               mlp_bias=False, qk_norm=True, tie_default=False, window="qwen"),
}

# Keys that ask for what no family here implements, with the value meaning "off". Checked for every
# family, so a checkpoint of an unknown fine-tune that sets one is refused by name, not served wrongly.
_OFF_WHEN_NULL = {
    "attn_logit_softcapping": "attention logit soft-capping",
    "final_logit_softcapping": "final logit soft-capping",
    "kv_lora_rank": "multi-head latent attention (MLA)",
    "q_lora_rank": "multi-head latent attention (MLA)",
    "quantization_config": "a quantized checkpoint",
}
_OFF_WHEN_ZERO = {
    "num_experts": "mixture of experts", "num_local_experts": "mixture of experts",
    "n_routed_experts": "mixture of experts",
}


def family_of(cfg: dict[str, Any]) -> Family:
    """The family of a config.json dict; UnsupportedConfig naming the key otherwise."""
    archs = cfg.get("architectures") or ["LlamaForCausalLM"]
    name = archs[0]
    if name not in FAMILIES:
        what = " (mixture of experts)" if "moe" in name.lower() or "mixtral" in name.lower() else ""
        raise UnsupportedConfig(f"architectures={archs!r}{what} is not supported (supported: {', '.join(FAMILIES)})")
    family = FAMILIES[name]
    for key, what in _OFF_WHEN_NULL.items():
        if cfg.get(key) not in (None, {}, False):
            raise UnsupportedConfig(f"{key}={_short(cfg[key])} asks for {what}, which this engine does not implement")
    for key, what in _OFF_WHEN_ZERO.items():
        if cfg.get(key):
            raise UnsupportedConfig(f"{key}={cfg[key]!r} asks for {what}, which this engine does not implement")
    act = cfg.get("hidden_act") or cfg.get("hidden_activation") or "silu"
    if act not in family.activations:
        raise UnsupportedConfig(f"hidden_act={act!r} is not supported for {name} (supported: {family.activations})")
    partial = cfg.get("partial_rotary_factor")
    if partial not in (None, 1, 1.0):
        raise UnsupportedConfig(f"partial_rotary_factor={partial!r}: only full rotary embeddings are implemented")
    _WINDOW_RULES[family.window](cfg)
    return family


def _short(value: Any) -> str:
    if isinstance(value, dict) and "quant_method" in value:
        return f"{{quant_method: {value['quant_method']!r}, ...}}"
    return repr(value)


def _window_from_key(cfg: dict[str, Any]) -> None:
    """Mistral style: a non-null `sliding_window` is a real window, unless it covers the whole context."""
    window, ctx = cfg.get("sliding_window"), int(cfg.get("max_position_embeddings") or 2048)
    if window is not None and int(window) < ctx:
        raise UnsupportedConfig(f"sliding_window={window!r} (< max_position_embeddings={ctx}) asks for "
                                "sliding-window attention, which this engine does not implement")
    _layer_types(cfg)


def _window_qwen(cfg: dict[str, Any]) -> None:
    """Qwen style: `sliding_window` is set in every config but only used with `use_sliding_window: true`,
    and then only in layers >= max_window_layers (transformers' Qwen2Config.layer_types)."""
    if cfg.get("use_sliding_window") and cfg.get("sliding_window") is not None:
        layers, first = int(cfg.get("num_hidden_layers") or 0), cfg.get("max_window_layers")
        if first is None or int(first) < layers:
            raise UnsupportedConfig(f"use_sliding_window=true (sliding_window={cfg['sliding_window']!r}, "
                                    f"max_window_layers={first!r}) asks for sliding-window layers, which this "
                                    "engine does not implement")
    _layer_types(cfg)


def _layer_types(cfg: dict[str, Any]) -> None:
    other = sorted({t for t in cfg.get("layer_types") or () if t != "full_attention"})
    if other:
        raise UnsupportedConfig(f"layer_types has {other}: only full_attention layers are implemented")


_WINDOW_RULES = {"key": _window_from_key, "qwen": _window_qwen}
