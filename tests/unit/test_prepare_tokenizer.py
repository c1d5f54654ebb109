"""The router's model directory: tokenizer files and config.json, never weights (issue 15)."""

from __future__ import annotations

import json
import shutil

import pytest

from engine.arch import ModelDirError
from engine.prepare import prepare_model, prepare_tokenizer
from engine.tokenizer import Tokenizer

TEXT = "Hello, how are you? Tell me about prefill and decode."


def test_gguf_source_gives_tokenizer_without_weights(tmp_path, smollm2_dir):
    out = prepare_tokenizer("smollm2", str(tmp_path / "cache"))
    assert not list(out.glob("*.safetensors")), "the router's directory must not hold weights"
    assert sum(f.stat().st_size for f in out.iterdir()) < 20_000_000
    mine, full = Tokenizer.from_dir(out), Tokenizer.from_dir(smollm2_dir)
    assert mine.encode(TEXT) == full.encode(TEXT)
    msgs = [{"role": "user", "content": TEXT}]
    assert mine.apply_chat_template(msgs) == full.apply_chat_template(msgs)
    assert json.loads((out / "config.json").read_text()) == json.loads((smollm2_dir / "config.json").read_text())
    assert prepare_tokenizer("smollm2", str(tmp_path / "cache")) == out  # cached


def test_a_tokenizer_only_directory_is_enough(tmp_path, tiny_model_dir):
    only = tmp_path / "tok"
    only.mkdir()
    for f in tiny_model_dir.iterdir():
        if f.suffix in (".json", ".jinja"):
            shutil.copy2(f, only / f.name)
    assert prepare_tokenizer(str(only), str(tmp_path / "cache")) == only
    with pytest.raises(ModelDirError, match="safetensors"):  # the workers still need the weights
        prepare_model(str(only), str(tmp_path / "cache"), progress=lambda m: None)
    (only / "tokenizer.json").unlink()
    with pytest.raises(ModelDirError, match="tokenizer.json"):
        prepare_tokenizer(str(only), str(tmp_path / "cache"))


def test_a_prepared_model_is_reused(tmp_path, tiny_model_dir):
    prepared = prepare_model(str(tiny_model_dir), str(tmp_path / "cache"), progress=lambda m: None)
    assert prepare_tokenizer(str(tiny_model_dir), str(tmp_path / "cache")) == tiny_model_dir
    assert prepared.is_dir()
