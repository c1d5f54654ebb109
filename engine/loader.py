"""load_model: a prepared HF directory -> (ModelArch, DecoderModel), weights streamed to the device.

The model is allocated once on the target device and dtype; every checkpoint tensor is then
copied, file by file and tensor by tensor, into its place (engine/safetensors_stream.py): the
separate q/k/v and gate/up tensors into their rows of the fused weights, on the device. Sharded
checkpoints are read through `model.safetensors.index.json`. A missing or unexpected tensor is an
error naming it (a weight silently left uninitialised would serve garbage).

Tensor parallel (engine/tensor_parallel.py): each rank copies only its block of a checkpoint tensor,
read straight from the mapped file (`copy_into`'s rows / cols), never the whole tensor: its heads'
rows of q/k/v (the shared KV head's rows when KV heads are replicated), its ffn rows of gate/up,
the matching columns of o/down, its vocabulary rows of embed/lm_head; norms and the o/down biases whole.
"""

from __future__ import annotations

import json
import pathlib
from typing import NamedTuple

import torch

from engine.arch import ModelArch, ModelDirError
from engine.model import DecoderModel
from engine.safetensors_stream import CheckpointError, SafetensorsFile
from engine.tensor_parallel import NO_TP, TPGroup, TPShard

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


class Dest(NamedTuple):  # NOTE: not a dataclass: slice defaults are unhashable, which dataclasses refuse
    """Where a checkpoint tensor goes: its block [rows, cols] (this rank's shard) into `tensor`."""

    tensor: torch.Tensor
    rows: slice = slice(None)
    cols: slice = slice(None)


def destinations(model: DecoderModel, arch: ModelArch) -> dict[str, Dest]:
    """Checkpoint tensor name -> the view of a model parameter it is copied into, and the block of it
    this rank holds (all of it at tp_size 1)."""
    shard, local, d = model.shard, model.local_arch, arch.head_dim
    q, kv, f = local.num_heads * d, local.num_kv_heads * d, local.intermediate_size
    q_rows, kv_rows = _span(shard.q_heads(arch), d), _span(shard.kv_heads(arch), d)
    f_rows, vocab, n_vocab = _span(shard.ffn_cols(arch)), _span(model.vocab), len(model.vocab)
    out = {"model.embed_tokens.weight": Dest(model.embed[:n_vocab], vocab), "model.norm.weight": Dest(model.norm)}
    if not arch.tie_word_embeddings:
        out["lm_head.weight"] = Dest(model.lm_head[:n_vocab], vocab)
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = Dest(layer.input_norm)
        out[p + "post_attention_layernorm.weight"] = Dest(layer.post_norm)
        for kind, fused in (("weight", layer.qkv), ("bias", layer.qkv_bias)):
            if fused is not None:
                out[p + f"self_attn.q_proj.{kind}"] = Dest(fused[:q], q_rows)
                out[p + f"self_attn.k_proj.{kind}"] = Dest(fused[q:q + kv], kv_rows)
                out[p + f"self_attn.v_proj.{kind}"] = Dest(fused[q + kv:], kv_rows)
        for kind, fused in (("weight", layer.gate_up), ("bias", layer.gate_up_bias)):
            if fused is not None:
                out[p + f"mlp.gate_proj.{kind}"] = Dest(fused[:f], f_rows)
                out[p + f"mlp.up_proj.{kind}"] = Dest(fused[f:], f_rows)
        out[p + "self_attn.o_proj.weight"] = Dest(layer.o, cols=q_rows)      # row-parallel: input columns
        out[p + "mlp.down_proj.weight"] = Dest(layer.down, cols=f_rows)
        whole = {"self_attn.o_proj.bias": layer.o_bias, "mlp.down_proj.bias": layer.down_bias,
                 "self_attn.q_norm.weight": layer.q_norm, "self_attn.k_norm.weight": layer.k_norm}
        out.update({p + n: Dest(t) for n, t in whole.items() if t is not None})
    return out


def _span(units: range, width: int = 1) -> slice:
    """The checkpoint rows (or columns) of a range of heads (width head_dim) or of single rows."""
    return slice(units.start * width, units.stop * width)


def load_model(model_dir, device="cpu", dtype: torch.dtype = torch.float32, shard: TPShard = NO_TP,
               group: TPGroup | None = None) -> tuple[ModelArch, DecoderModel]:
    """(the model's ModelArch, its DecoderModel or this rank's shard of it). With tp_size > 1 the
    rank's KVPool and ModelRunner take `model.local_arch`, not the returned (whole-model) arch."""
    model_dir = pathlib.Path(model_dir)
    arch = ModelArch.from_model_dir(model_dir)
    model = DecoderModel(arch, dtype=dtype, device=device, shard=shard, group=group)
    todo = destinations(model, arch)
    for path in weight_files(model_dir):
        try:
            with SafetensorsFile(path) as f:
                for name in f.entries:
                    dst = todo.pop(name, None)
                    if dst is not None:
                        f.copy_into(name, dst.tensor, dst.rows, dst.cols)
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
