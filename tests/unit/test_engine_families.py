"""What config.json asks for that the engine does not implement is refused in one line naming the key
and its value: at ModelArch, at `pdorch model prepare` and at `pdorch serve` (no traceback)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from engine.arch import ModelArch, ModelDirError
from engine.families import FAMILIES

BASE = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
        "num_hidden_layers": 2, "vocab_size": 100, "max_position_embeddings": 4096}


def hf_config(cls_name: str, **kw) -> dict:
    """config.json as transformers writes it for that config class (architectures set as a checkpoint has)."""
    import transformers

    cfg = getattr(transformers, cls_name)(**{**BASE, **kw}).to_dict()
    return cfg


REFUSED = [
    # (config.json, what the one-line message must name)
    ({**hf_config("MixtralConfig"), "architectures": ["MixtralForCausalLM"]}, r"architectures=\['MixtralForCausalLM'\] \(mixture of experts\)"),
    ({**hf_config("Qwen2MoeConfig"), "architectures": ["Qwen2MoeForCausalLM"]}, r"architectures=\['Qwen2MoeForCausalLM'\] \(mixture of experts\)"),
    ({**BASE, "architectures": ["LlamaForCausalLM"], "num_local_experts": 8}, r"num_local_experts=8 .*mixture of experts"),
    ({**hf_config("MistralConfig", sliding_window=1024), "architectures": ["MistralForCausalLM"]},
     r"sliding_window=1024 \(< max_position_embeddings=4096\)"),
    ({**BASE, "architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True, "sliding_window": 512,
      "max_window_layers": 0}, r"use_sliding_window=true \(sliding_window=512, max_window_layers=0\)"),
    ({**hf_config("Qwen3Config", use_sliding_window=True, sliding_window=512, max_window_layers=1),
      "architectures": ["Qwen3ForCausalLM"]}, r"use_sliding_window=true .*max_window_layers=1"),
    ({**BASE, "architectures": ["Qwen2ForCausalLM"], "layer_types": ["full_attention", "sliding_attention"]},
     r"layer_types has \['sliding_attention'\]"),
    ({**BASE, "architectures": ["LlamaForCausalLM"], "final_logit_softcapping": 30.0},
     r"final_logit_softcapping=30.0 asks for final logit soft-capping"),
    ({**BASE, "architectures": ["LlamaForCausalLM"], "kv_lora_rank": 512}, r"kv_lora_rank=512 .*MLA"),
    ({**BASE, "architectures": ["LlamaForCausalLM"], "quantization_config": {"quant_method": "awq", "bits": 4}},
     r"quantization_config=\{quant_method: 'awq', \.\.\.\} asks for a quantized checkpoint"),
    ({**BASE, "architectures": ["LlamaForCausalLM"], "hidden_act": "gelu"}, r"hidden_act='gelu' is not supported"),
    ({**BASE, "architectures": ["LlamaForCausalLM"], "partial_rotary_factor": 0.5}, r"partial_rotary_factor=0.5"),
    ({**BASE, "architectures": ["GPT2LMHeadModel"]}, r"architectures=\['GPT2LMHeadModel'\] is not supported"),
    ({**BASE, "rope_scaling": {"rope_type": "longrope"}}, "rope scaling type 'longrope'"),
    ({**BASE, "num_key_value_heads": 3}, "not a multiple"),
]


@pytest.mark.parametrize("cfg,message", REFUSED, ids=[m[:40] for _, m in REFUSED])
def test_unsupported_configs_are_refused_by_key(cfg, message):
    with pytest.raises(ModelDirError, match=message) as e:
        ModelArch.from_config(cfg)
    assert "\n" not in str(e.value)


ACCEPTED = [
    # Qwen2.5 / Qwen1.5 as released: a window size that is off.
    ({**BASE, "architectures": ["Qwen2ForCausalLM"], "sliding_window": 32768, "use_sliding_window": False,
      "max_window_layers": 21}, "qwen2"),
    # use_sliding_window on, but max_window_layers covers every layer: no layer slides (transformers agrees).
    ({**BASE, "architectures": ["Qwen2ForCausalLM"], "sliding_window": 512, "use_sliding_window": True,
      "max_window_layers": 28}, "qwen2"),
    ({**hf_config("MistralConfig", sliding_window=None), "architectures": ["MistralForCausalLM"]}, "mistral"),
    ({**BASE, "architectures": ["MistralForCausalLM"], "sliding_window": 4096}, "mistral"),  # window = context
    ({**hf_config("Qwen3Config"), "architectures": ["Qwen3ForCausalLM"]}, "qwen3"),
    ({**BASE, "architectures": ["LlamaForCausalLM"], "attention_bias": True, "mlp_bias": True}, "llama"),
]


@pytest.mark.parametrize("cfg,family", ACCEPTED)
def test_supported_configs_are_accepted(cfg, family):
    arch = ModelArch.from_config(cfg)
    assert arch.family == family


def test_family_features_come_from_the_table_and_config():
    llama = ModelArch.from_config({**BASE, "architectures": ["LlamaForCausalLM"], "attention_bias": True})
    assert (llama.qkv_bias, llama.o_bias, llama.mlp_bias, llama.qk_norm) == (True, True, False, False)
    qwen2 = ModelArch.from_config({**BASE, "architectures": ["Qwen2ForCausalLM"]})
    assert (qwen2.qkv_bias, qwen2.o_bias, qwen2.qk_norm) == (True, False, False)
    qwen3 = ModelArch.from_config({**BASE, "architectures": ["Qwen3ForCausalLM"], "torch_dtype": "bfloat16"})
    assert (qwen3.qkv_bias, qwen3.qk_norm, qwen3.checkpoint_dtype) == (False, True, "bfloat16")
    assert ModelArch.from_config({**BASE, "dtype": "float16"}).checkpoint_dtype == "float16"  # transformers 5 key
    assert set(FAMILIES) == {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"}


@pytest.fixture
def sliding_window_dir(tmp_path, tiny_model_dir):
    """The tiny model's files with a Mistral config asking for a real sliding window."""
    d = tmp_path / "mistral-sw"
    d.mkdir()
    for f in tiny_model_dir.iterdir():
        (d / f.name).symlink_to(f)
    (d / "config.json").unlink()
    cfg = json.loads((tiny_model_dir / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "architectures": ["MistralForCausalLM"], "sliding_window": 256}))
    return d


@pytest.mark.parametrize("command", [["model", "prepare"], ["serve", "--model"]])
def test_cli_refuses_in_one_line(command, sliding_window_dir, tmp_path):
    env_cache = ["--cache-dir", str(tmp_path / "cache")] if command[0] == "model" else \
        ["--set", f"model.cache_dir={tmp_path / 'cache'}", "--log-dir", str(tmp_path / "logs")]
    run = subprocess.run([sys.executable, "-c", "import sys; from pdorch.cli import main; sys.exit(main())",
                          *command, str(sliding_window_dir), *env_cache], check=False, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr + run.stdout
    out = run.stderr + run.stdout
    assert "Traceback" not in out
    refusal = [line for line in out.splitlines() if "sliding_window=256" in line]
    assert len(refusal) == 1 and "max_position_embeddings=2048" in refusal[0], out
