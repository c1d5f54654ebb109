"""Random-weights checkpoints of the families pdorch serves, built by transformers' own config and
model classes and saved with `save_pretrained` (safetensors), as a real checkpoint arrives.

For tests and benchmarks (no hub download): tiny shapes by default, any shape on request. The
tokenizer is the packaged SmolLM2 one, with each family's chat template style, stop tokens and
generation_config.json; Llama-3 gets its header tokens and a BOS post-processor on top.

    build_checkpoint("qwen2", out_dir)                       # tiny Qwen2: q/k/v biases, tied embeddings
    build_checkpoint("llama3", out_dir, shard_mb=2)          # sharded: model.safetensors.index.json
    build_checkpoint("qwen2", out_dir, dtype="bfloat16", shape=QWEN25_05B)   # bench/engine/model_load.py
"""

from __future__ import annotations

import json
import pathlib

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 4096}
QWEN25_05B = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
              "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 32768, "vocab_size": 151936}

_CHATML = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + "
    "'<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}{%- for m in messages %}{%- if not (loop.first and m['role'] == 'system') %}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
# Qwen3 style: earlier answers lose their reasoning; enable_thinking=false pre-fills an empty one.
_CHATML_THINK = (
    "{%- for m in messages %}{%- set content = m['content'] %}"
    "{%- if m['role'] == 'assistant' and '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}{%- endif %}")
_LLAMA3 = (
    "{{- bos_token }}{%- if not date_string is defined %}{%- set date_string = '26 Jul 2024' %}{%- endif %}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system = messages[0]['content'] | trim %}"
    "{%- set messages = messages[1:] %}{%- else %}{%- set system = '' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' + 'Today Date: ' + date_string + '\\n\\n' + system "
    "+ '<|eot_id|>' }}{%- for m in messages %}"
    "{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}")
_LLAMA3_TOKENS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

FAMILIES = ("llama3", "qwen2", "qwen3", "mistral")
_NO_TOKENIZER = {"bos": 1, "eos": 2, "pad": 0, "vocab_size": 2048,
                 "generation": {"bos_token_id": 1, "eos_token_id": [2], "pad_token_id": 0}}


def build_checkpoint(family: str, out_dir, *, seed: int = 0, dtype: str = "float32", shape: dict | None = None,
                     shard_mb: int = 0, std: float = 0.05, tokenizer: bool = True,
                     **config_overrides) -> pathlib.Path:
    """Save a random `family` checkpoint into out_dir (created) and return it.

    `tokenizer=False`: no tokenizer files, special ids 0-2 and a 2,048-token vocabulary (for checks that
    compare token ids and logits only, on a machine without the SmolLM2 package to build one from)."""
    import torch
    from transformers import AutoModelForCausalLM

    if family not in FAMILIES:
        raise ValueError(f"family {family!r}: one of {FAMILIES}")
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    specials = _write_tokenizer(family, out) if tokenizer else _NO_TOKENIZER
    cfg = _config(family, {**TINY, **(shape or {})}, specials, std, config_overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():  # HF initialises norms to 1 and biases to 0: make both count
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, std)
            elif "norm" in name:
                p.normal_(1.0, 0.1)
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(str(out), max_shard_size=f"{shard_mb}MB" if shard_mb else "50GB")
    if family in ("qwen2", "qwen3"):  # as released Qwen configs: a window that is off
        path = out / "config.json"
        saved = json.loads(path.read_text())
        saved.update({"sliding_window": 32768, "use_sliding_window": False, "max_window_layers": 21,
                      **{k: v for k, v in config_overrides.items() if k in ("sliding_window", "use_sliding_window",
                                                                           "max_window_layers")}})
        path.write_text(json.dumps(saved, indent=2))
    # NOTE: after save_pretrained, which writes a generation_config.json of its own
    (out / "generation_config.json").write_text(json.dumps(specials["generation"], indent=2))
    for p in out.glob("*.safetensors"):
        p.chmod(0o644)  # NOTE: safetensors creates files 0600
    return out


def _config(family: str, shape: dict, specials: dict, std: float, overrides: dict):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    common = {**shape, "vocab_size": max(shape.get("vocab_size", 0), specials["vocab_size"]),
              "rms_norm_eps": 1e-6, "initializer_range": std, "bos_token_id": specials["bos"],
              "eos_token_id": specials["eos"], "pad_token_id": specials["pad"]}
    common.update({k: v for k, v in overrides.items() if k not in ("sliding_window", "use_sliding_window",
                                                                   "max_window_layers")})
    if family == "llama3":
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 512}
        return LlamaConfig(**{"tie_word_embeddings": False, "rope_parameters": rope, **common})
    if family == "mistral":
        return MistralConfig(**{"tie_word_embeddings": False, "sliding_window": None, **common})
    if family == "qwen2":
        return Qwen2Config(**{"tie_word_embeddings": True, "rope_parameters": {"rope_type": "default",
                                                                              "rope_theta": 1000000.0}, **common})
    # Qwen3: head_dim above hidden / heads, as in the released models (q is wider than the hidden state).
    return Qwen3Config(**{"tie_word_embeddings": True, "rope_parameters": {"rope_type": "default",
                                                                          "rope_theta": 1000000.0},
                          **common, "head_dim": 2 * shape["hidden_size"] // shape["num_attention_heads"]})


def _write_tokenizer(family: str, out: pathlib.Path) -> dict:
    """SmolLM2's tokenizer files in `family`'s style; returns its special ids and vocabulary size."""
    from tokenizers import AddedToken, Tokenizer, processors

    from engine.gguf_convert import write_tokenizer_files
    from engine.prepare import _smollm2_tokenizer

    tok = _smollm2_tokenizer()
    write_tokenizer_files(tok, out, 4096)
    tk = Tokenizer.from_file(str(out / "tokenizer.json"))
    tcfg = json.loads((out / "tokenizer_config.json").read_text())
    endoftext, im_end = tk.token_to_id("<|endoftext|>"), tk.token_to_id("<|im_end|>")
    if family == "llama3":
        tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in _LLAMA3_TOKENS])
        bos, eot = tk.token_to_id("<|begin_of_text|>"), tk.token_to_id("<|eot_id|>")
        # Llama 3: a plain encode() starts with BOS; the chat template writes it itself.
        tk.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B",
                                                          special_tokens=[("<|begin_of_text|>", bos)])
        ids = {"bos": bos, "eos": [endoftext, eot], "pad": endoftext}
        tcfg.update({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "pad_token": None,
                     "chat_template": _LLAMA3})
    else:
        ids = {"bos": endoftext, "eos": im_end, "pad": endoftext}
        tcfg.update({"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                     "chat_template": _CHATML_THINK if family == "qwen3" else _CHATML})
    tk.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2, ensure_ascii=False))
    eos = ids["eos"] if isinstance(ids["eos"], list) else [ids["eos"], endoftext]
    gen = {"bos_token_id": ids["bos"], "eos_token_id": eos, "pad_token_id": ids["pad"]}
    return {**ids, "generation": gen, "vocab_size": tk.get_vocab_size(with_added_tokens=True)}
