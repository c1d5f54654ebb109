"""GGUF conversion refuses RoPE variants it would otherwise convert silently wrong (Llama-3.x
`rope_freqs`, rope scaling keys, partial rotary), and accepts SmolLM2's plain RoPE."""

from __future__ import annotations

import numpy as np
import pytest

from engine.arch import ModelDirError
from engine.gguf_convert import convert_gguf, refuse_unsupported_rope
from engine.prepare import smollm2_gguf_path


def _write_gguf(path, rope_freqs: bool = False, dims: int | None = None, scaling: str | None = None) -> None:
    from gguf import GGUFWriter
    w = GGUFWriter(str(path), "llama")
    w.add_embedding_length(8)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    if dims is not None:
        w.add_rope_dimension_count(dims)
    if scaling is not None:
        w.add_string("llama.rope.scaling.type", scaling)
    if rope_freqs:
        w.add_tensor("rope_freqs.weight", np.ones(2, dtype=np.float32))
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("kind, match", [({"rope_freqs": True}, "rope_freqs"),
                                         ({"dims": 2}, "dimension_count=2"),
                                         ({"scaling": "yarn"}, "scaling.type=yarn")])
def test_llama3_style_rope_is_refused_by_name(tmp_path, kind, match):
    path = tmp_path / "m.gguf"
    _write_gguf(path, **kind)
    with pytest.raises(ModelDirError, match=match):
        convert_gguf(path, tmp_path / "out", progress=lambda m: None)


def test_plain_rope_passes(tmp_path):
    from gguf import GGUFReader
    path = tmp_path / "m.gguf"
    _write_gguf(path, dims=4)
    refuse_unsupported_rope(path, GGUFReader(str(path)), head_dim=4)
    refuse_unsupported_rope(smollm2_gguf_path(), GGUFReader(str(smollm2_gguf_path())), head_dim=64)
