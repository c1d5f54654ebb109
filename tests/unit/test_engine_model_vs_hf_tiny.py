"""Our Llama vs transformers' LlamaForCausalLM on tiny random models: RoPE scaling variants
(linear, dynamic, llama3, yarn), untied lm_head, GQA. Same directory loaded by both."""

import pytest
import torch

from engine.kv_pool import KVPool
from engine.loader import load_model
from engine.model_runner import Chunk, ModelRunner
from engine.prepare import make_tiny_model
from engine.rope import inv_freq_and_scale

VARIANTS = {
    "default-untied": (None, False),
    "linear": ({"rope_type": "linear", "factor": 2.0}, True),
    "dynamic": ({"rope_type": "dynamic", "factor": 2.0}, True),
    "llama3": ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 256}, True),
    "yarn": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}, True),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_logits_match_transformers(name, tmp_path):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(2)
    scaling, tie = VARIANTS[name]
    d = make_tiny_model(tmp_path / name, seed=5, tie_word_embeddings=tie, rope_scaling=scaling)
    arch, model = load_model(d)
    hf = AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()
    inv, scale = inv_freq_and_scale(arch)
    assert torch.allclose(inv, hf.model.rotary_emb.inv_freq.float(), rtol=1e-6)
    assert scale == pytest.approx(float(hf.model.rotary_emb.attention_scaling))

    ids = torch.randint(3, 40000, (300,), generator=torch.Generator().manual_seed(1)).tolist()
    runner = ModelRunner(model, arch, KVPool(arch, 32, 16))
    pages = list(range(19))
    ours_full = runner.forward([Chunk(pages, 0, ids)])[0]
    ours_tail = runner.forward([Chunk(pages, 290, ids[290:])])[0]  # on top of cached pages
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0, -1]
    assert (ours_full - ref).abs().max() < 1e-4
    assert (ours_tail - ref).abs().max() < 1e-4
