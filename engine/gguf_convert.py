"""GGUF (llama.cpp) -> Hugging Face directory, without torch or transformers.

Weights are dequantized to fp32 with `gguf.quants`; the tokenizer is rebuilt with HF `tokenizers`
from the GGUF vocab and merges.
"""

from __future__ import annotations

import json
import os
import pathlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from engine.arch import ModelDirError, llama_config

# GGUF token types (llama.cpp `llama_token_type`): 3 = control, 4 = user defined. Both become
# added tokens that the BPE model never splits.
_SPECIAL_TOKEN_TYPES = (3, 4)

# GGUF tensor name suffix -> HF name (within `model.layers.{i}.`).
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


@dataclass(frozen=True)
class GGUFTokenizer:
    tokens: list[str]
    merges: list[str]
    token_types: list[int]
    pre: str
    bos_id: int | None
    eos_id: int | None
    pad_id: int | None
    unk_id: int | None
    chat_template: str | None


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def read_gguf_tokenizer(path: pathlib.Path, reader=None) -> GGUFTokenizer:
    from gguf import GGUFReader

    reader = reader or GGUFReader(str(path))
    model = _field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise ModelDirError(f"{path}: tokenizer model {model!r} is not supported (only byte-level BPE 'gpt2')")
    return GGUFTokenizer(
        tokens=_field(reader, "tokenizer.ggml.tokens"), merges=_field(reader, "tokenizer.ggml.merges"),
        token_types=_field(reader, "tokenizer.ggml.token_type"), pre=_field(reader, "tokenizer.ggml.pre", "default"),
        bos_id=_field(reader, "tokenizer.ggml.bos_token_id"), eos_id=_field(reader, "tokenizer.ggml.eos_token_id"),
        pad_id=_field(reader, "tokenizer.ggml.padding_token_id"),
        unk_id=_field(reader, "tokenizer.ggml.unknown_token_id"),
        chat_template=_field(reader, "tokenizer.chat_template"))


def build_tokenizer(tok: GGUFTokenizer):
    """A `tokenizers.Tokenizer` equal to the model's original tokenizer.json."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(tok.tokens)}
    merges = [tuple(m.split(" ", 1)) for m in tok.merges]
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if tok.pre == "smollm":
        # NOTE: llama.cpp's "smollm" pre-tokenizer = every digit on its own, then the GPT-2 regex;
        # the same as SmolLM2's original tokenizer.json (Digits(individual) + ByteLevel).
        tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif tok.pre in ("default", "gpt2", "gpt-2"):
        tk.pre_tokenizer = byte_level
    else:
        raise ModelDirError(f"GGUF pre-tokenizer {tok.pre!r} is not supported (supported: smollm, gpt2)")
    tk.decoder = decoders.ByteLevel()
    specials = [t for t, ty in zip(tok.tokens, tok.token_types) if ty in _SPECIAL_TOKEN_TYPES]
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return tk


def write_tokenizer_files(tok: GGUFTokenizer, out: pathlib.Path, max_len: int) -> None:
    build_tokenizer(tok).save(str(out / "tokenizer.json"))
    name = lambda i: None if i is None else tok.tokens[i]
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": name(tok.bos_id),
           "eos_token": name(tok.eos_id), "pad_token": name(tok.pad_id), "unk_token": name(tok.unk_id),
           "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
           "model_max_length": max_len}
    if tok.chat_template:
        cfg["chat_template"] = tok.chat_template
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False))
    gen = {"bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id, "pad_token_id": tok.pad_id}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2))


def unpermute_rotary(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation so rotate_half RoPE (HF layout) applies.

    NOTE: llama.cpp stores each head's rows interleaved as (pair, 2); HF keeps the two rotary
    halves apart. Per head: rows [d0 d0' d1 d1' ...] -> [d0 d1 ... | d0' d1' ...].
    """
    out_dim, in_dim = w.shape
    return w.reshape(n_head, out_dim // n_head // 2, 2, in_dim).swapaxes(1, 2).reshape(out_dim, in_dim)


def refuse_unsupported_rope(path: pathlib.Path, reader, head_dim: int) -> None:
    """Raise ModelDirError for RoPE variants this converter would get silently wrong.

    Llama-3.x GGUFs carry their frequency scaling as a `rope_freqs` tensor (and may carry
    `rope.scaling.*` keys); partial rotary shows as `rope.dimension_count` < head_dim. Converting
    them as plain RoPE would load and generate, just wrongly, so they are refused by name.
    """
    found = [t.name for t in reader.tensors if t.name.startswith("rope_freqs")]
    scaling = _field(reader, "llama.rope.scaling.type", "none")
    if scaling not in ("none", None):
        found.append(f"llama.rope.scaling.type={scaling}")
    dims = _field(reader, "llama.rope.dimension_count", head_dim)
    if dims != head_dim:
        found.append(f"llama.rope.dimension_count={dims} (head_dim {head_dim})")
    if found:
        raise ModelDirError(f"{path}: RoPE scaling / partial rotary is not supported in GGUF conversion "
                            f"({', '.join(found)}); prepare the model from its Hugging Face checkpoint "
                            "directory instead (its config.json rope_scaling is supported)")


def read_gguf_header(path: pathlib.Path):
    """(reader, HF config.json dict, tokenizer, heads, kv_heads) from a GGUF's metadata; no tensor is read."""
    from gguf import GGUFReader


    reader = GGUFReader(str(path))
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ModelDirError(f"{path}: architecture {arch!r} is not supported (only 'llama')")
    g = lambda k, d=None: _field(reader, f"llama.{k}", d)
    hidden, heads = g("embedding_length"), g("attention.head_count")
    kv_heads = g("attention.head_count_kv", heads)
    head_dim = g("attention.key_length", hidden // heads)
    refuse_unsupported_rope(path, reader, head_dim)
    tok = read_gguf_tokenizer(path, reader)
    names = {t.name for t in reader.tensors}
    cfg = llama_config(vocab_size=g("vocab_size", len(tok.tokens)), hidden_size=hidden,
                       intermediate_size=g("feed_forward_length"), num_layers=g("block_count"), num_heads=heads,
                       num_kv_heads=kv_heads, head_dim=head_dim, rope_theta=float(g("rope.freq_base", 10000.0)),
                       rms_norm_eps=float(g("attention.layer_norm_rms_epsilon")),
                       max_position_embeddings=g("context_length"), tie="output.weight" not in names,
                       bos=tok.bos_id, eos=tok.eos_id, pad=tok.pad_id)
    return reader, cfg, tok, heads, kv_heads


def write_gguf_tokenizer_dir(path: pathlib.Path, out: pathlib.Path) -> None:
    """Only config.json and the tokenizer files of a GGUF: what the router needs, without weights."""
    _, cfg, tok, _, _ = read_gguf_header(path)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    write_tokenizer_files(tok, out, cfg["max_position_embeddings"])


def convert_gguf(path: pathlib.Path, out: pathlib.Path, progress: Callable[[str], None]) -> None:
    from gguf.quants import dequantize
    from safetensors.numpy import save_file

    t0 = time.monotonic()
    progress(f"[prepare] reading {path.name}")
    reader, cfg, tok, heads, kv_heads = read_gguf_header(path)
    tensors: dict[str, np.ndarray] = {}
    for i, t in enumerate(reader.tensors):
        w = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        if t.name == "token_embd.weight":
            hf = "model.embed_tokens.weight"
        elif t.name == "output_norm.weight":
            hf = "model.norm.weight"
        elif t.name == "output.weight":
            hf = "lm_head.weight"
        elif t.name.startswith("blk."):
            _, layer, suffix = t.name.split(".", 2)
            if suffix not in _LAYER_NAMES:
                raise ModelDirError(f"{path}: unexpected tensor {t.name}")
            hf = f"model.layers.{layer}.{_LAYER_NAMES[suffix]}"
            if suffix == "attn_q.weight":
                w = unpermute_rotary(w, heads)
            elif suffix == "attn_k.weight":
                w = unpermute_rotary(w, kv_heads)
        else:
            raise ModelDirError(f"{path}: unexpected tensor {t.name}")
        tensors[hf] = np.ascontiguousarray(w)
        if i % 40 == 0:
            progress(f"[prepare] dequantized {i + 1}/{len(reader.tensors)} tensors")
    progress(f"[prepare] writing model.safetensors ({sum(a.nbytes for a in tensors.values()) / 1e6:.0f} MB)")
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    os.chmod(out / "model.safetensors", 0o644)  # NOTE: safetensors creates it 0600
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    write_tokenizer_files(tok, out, cfg["max_position_embeddings"])
    progress(f"[prepare] converted {path.name} in {time.monotonic() - t0:.1f}s")
