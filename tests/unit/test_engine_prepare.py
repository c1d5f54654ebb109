"""engine.prepare: conversion is cached, idempotent, and produces a loadable HF directory."""

import json

import numpy as np
import pytest

from engine.arch import ModelArch, ModelDirError
from engine.gguf_convert import unpermute_rotary
from engine.prepare import MARKER, is_prepared, main, make_tiny_model, prepare_model, weights_digest


def test_smollm2_dir_is_a_standard_hf_dir(smollm2_dir):
    assert is_prepared(smollm2_dir)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json"):
        assert (smollm2_dir / name).is_file(), name
    arch = ModelArch.from_model_dir(smollm2_dir)
    assert (arch.num_layers, arch.hidden_size, arch.num_heads, arch.num_kv_heads, arch.head_dim) == (30, 576, 9, 3, 64)
    assert arch.tie_word_embeddings and arch.rope_theta == 100000.0 and arch.eos_token_ids == (2,)
    assert "chat_template" in json.loads((smollm2_dir / "tokenizer_config.json").read_text())


def test_prepare_cached_is_fast_and_digest_stable(smollm2_dir, tmp_path):
    msgs = []
    again = prepare_model("smollm2", str(smollm2_dir.parent), progress=msgs.append)
    assert again == smollm2_dir and msgs == [f"[prepare] {smollm2_dir} is ready (cached)"]
    assert weights_digest(smollm2_dir) == weights_digest(smollm2_dir)
    assert json.loads((smollm2_dir / MARKER).read_text())["weights_digest"] == weights_digest(smollm2_dir)


def test_hf_dir_source_is_linked_into_cache(tiny_model_dir, tmp_path, capsys):
    assert main([str(tiny_model_dir), "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr()
    prepared = tmp_path / out.out.strip().rsplit("/", 1)[-1]
    assert is_prepared(prepared) and "[prepare]" in out.err
    assert (prepared / "model.safetensors").is_symlink()
    assert weights_digest(prepared) == weights_digest(tiny_model_dir)


def test_tiny_model_is_deterministic_and_digest_sees_weights(tmp_path):
    a = make_tiny_model(tmp_path / "a")
    b = make_tiny_model(tmp_path / "b")
    c = make_tiny_model(tmp_path / "c", seed=1)
    assert weights_digest(a) == weights_digest(b) != weights_digest(c)


def test_bad_sources_are_named(tmp_path):
    with pytest.raises(ModelDirError, match="neither 'smollm2'"):
        prepare_model(str(tmp_path / "missing"), str(tmp_path))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelDirError, match="lacks config.json"):
        prepare_model(str(tmp_path / "empty"), str(tmp_path / "cache"))
    assert main([str(tmp_path / "missing"), "--cache-dir", str(tmp_path)]) == 2


def test_unpermute_rotary_restores_half_split_order():
    # one head, head_dim 4: llama.cpp rows [x0, y0, x1, y1] -> HF rows [x0, x1, y0, y1]
    w = np.array([[0.0], [10.0], [1.0], [11.0]])
    assert unpermute_rotary(w, 1)[:, 0].tolist() == [0.0, 1.0, 10.0, 11.0]
