"""load_model: a prepared HF directory -> (ModelArch, LlamaModel) with safetensors only."""

from __future__ import annotations

import json
import pathlib

import torch
from safetensors import safe_open

from engine.arch import ModelArch, ModelDirError
from engine.model import LlamaModel


def _weight_files(model_dir: pathlib.Path) -> list[pathlib.Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / n for n in names]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelDirError(f"{model_dir} has no *.safetensors weights")
    return files


def load_model(model_dir, device="cpu", dtype: torch.dtype = torch.float32) -> tuple[ModelArch, LlamaModel]:
    model_dir = pathlib.Path(model_dir)
    arch = ModelArch.from_model_dir(model_dir)
    device = torch.device(device)
    tensors: dict[str, torch.Tensor] = {}
    for path in _weight_files(model_dir):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                tensors[name] = f.get_tensor(name)
    model = LlamaModel(arch, dtype=dtype, device=device)

    def take(name: str) -> torch.Tensor:
        try:
            return tensors.pop(name)
        except KeyError:
            raise ModelDirError(f"{model_dir}: weight {name!r} missing") from None

    def put(param: torch.nn.Parameter, value: torch.Tensor) -> None:
        if param.shape != value.shape:
            raise ModelDirError(f"{model_dir}: weight shape {tuple(value.shape)} != expected {tuple(param.shape)}")
        param.copy_(value)

    with torch.no_grad():
        put(model.embed, take("model.embed_tokens.weight"))
        put(model.norm, take("model.norm.weight"))
        if not arch.tie_word_embeddings:
            put(model.lm_head, take("lm_head.weight"))
        tensors.pop("lm_head.weight", None)  # a tied checkpoint may still carry a copy
        for i, layer in enumerate(model.layers):
            p = f"model.layers.{i}."
            put(layer.input_norm, take(p + "input_layernorm.weight"))
            put(layer.post_norm, take(p + "post_attention_layernorm.weight"))
            put(layer.qkv, torch.cat([take(p + f"self_attn.{n}_proj.weight") for n in "qkv"]))
            put(layer.o, take(p + "self_attn.o_proj.weight"))
            put(layer.gate_up, torch.cat([take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")]))
            put(layer.down, take(p + "mlp.down_proj.weight"))
    leftover = [n for n in tensors if "rotary_emb" not in n]
    if leftover:
        raise ModelDirError(f"{model_dir}: unexpected weights (biases or another architecture?): {leftover[:5]}")
    model.eval()
    return arch, model
