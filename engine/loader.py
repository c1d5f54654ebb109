"""load_model: a prepared HF directory -> (ModelArch, DecoderModel), weights streamed to the device.

The model is allocated once on the target device and dtype; every checkpoint tensor is then
copied, file by file and tensor by tensor, into its place (engine/safetensors_stream.py): the
separate q/k/v and gate/up tensors into their rows of the fused weights, on the device. Sharded
checkpoints are read through `model.safetensors.index.json`. A missing or unexpected tensor is an
error naming it (a weight silently left uninitialised would serve garbage).
"""

from __future__ import annotations

import json
import pathlib

import torch

from engine.arch import ModelArch, ModelDirError
from engine.model import DecoderModel
from engine.safetensors_stream import CheckpointError, SafetensorsFile

# Checkpoint tensors no layer reads: HF's cached RoPE table, and lm_head when the embeddings are tied.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def weight_files(model_dir: pathlib.Path) -> list[pathlib.Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [n for n in names if not (model_dir / n).is_file()]
        if missing:
            raise ModelDirError(f"{model_dir}: shards named in model.safetensors.index.json are missing: {missing}")
        return [model_dir / n for n in names]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelDirError(f"{model_dir} has no *.safetensors weights")
    return files


def destinations(model: DecoderModel, arch: ModelArch) -> dict[str, torch.Tensor]:
    """Checkpoint tensor name -> the view of a model parameter it is copied into."""
    q, kv = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    f = arch.intermediate_size
    out = {"model.embed_tokens.weight": model.embed, "model.norm.weight": model.norm}
    if not arch.tie_word_embeddings:
        out["lm_head.weight"] = model.lm_head
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = layer.input_norm
        out[p + "post_attention_layernorm.weight"] = layer.post_norm
        for kind, fused in (("weight", layer.qkv), ("bias", layer.qkv_bias)):
            if fused is not None:
                out.update({p + f"self_attn.{n}_proj.{kind}": fused[a:b]
                            for n, (a, b) in zip("qkv", ((0, q), (q, q + kv), (q + kv, q + 2 * kv)))})
        for kind, fused in (("weight", layer.gate_up), ("bias", layer.gate_up_bias)):
            if fused is not None:
                out[p + f"mlp.gate_proj.{kind}"], out[p + f"mlp.up_proj.{kind}"] = fused[:f], fused[f:]
        named = {"self_attn.o_proj.weight": layer.o, "self_attn.o_proj.bias": layer.o_bias,
                 "mlp.down_proj.weight": layer.down, "mlp.down_proj.bias": layer.down_bias,
                 "self_attn.q_norm.weight": layer.q_norm, "self_attn.k_norm.weight": layer.k_norm}
        out.update({p + n: t for n, t in named.items() if t is not None})
    return out


def load_model(model_dir, device="cpu", dtype: torch.dtype = torch.float32) -> tuple[ModelArch, DecoderModel]:
    model_dir = pathlib.Path(model_dir)
    arch = ModelArch.from_model_dir(model_dir)
    model = DecoderModel(arch, dtype=dtype, device=device)
    todo = destinations(model, arch)
    for path in weight_files(model_dir):
        try:
            with SafetensorsFile(path) as f:
                for name in f.entries:
                    dst = todo.pop(name, None)
                    if dst is not None:
                        f.copy_into(name, dst)
                    elif not _ignored(name, arch):
                        raise ModelDirError(f"{path}: unexpected weight {name!r} (not part of a {arch.family} model "
                                            f"with this config.json: another architecture, or a bias it does not "
                                            "declare?)")
        except CheckpointError as e:
            raise ModelDirError(str(e)) from None
    if todo:
        raise ModelDirError(f"{model_dir}: weights missing from the checkpoint: {sorted(todo)[:5]}")
    model.eval()
    return arch, model


def _ignored(name: str, arch: ModelArch) -> bool:
    return name.endswith(_IGNORED_SUFFIXES) or (name == "lm_head.weight" and arch.tie_word_embeddings)
