"""Chat templates, BOS and stop tokens of each family, read from the checkpoint's own files
(tokenizer.json, tokenizer_config.json, chat_template.jinja, generation_config.json), against
transformers' PreTrainedTokenizerFast reading the same directory.

NOTE: not AutoTokenizer: for model_type qwen2 transformers 5 picks Qwen2Tokenizer, which brings Qwen's own
pre-tokenizer regex instead of the one in tokenizer.json; these test checkpoints carry SmolLM2's
tokenizer.json (a released Qwen checkpoint carries Qwen's, and then both agree)."""

from __future__ import annotations

import pytest

from engine.sampling_params import SamplingParams
from engine.stop import StopChecker
from engine.tokenizer import Tokenizer
from pdorch.local_stack.hf_checkpoints import build_checkpoint

CONVERSATIONS = [
    [{"role": "user", "content": "What is a KV cache?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"},
     {"role": "assistant", "content": "<think>greet back</think>\n\nhi"}, {"role": "user", "content": "more"}],
]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("templates")
    return {f: build_checkpoint(f, root / f) for f in ("llama3", "qwen2", "qwen3")}


@pytest.mark.parametrize("family", ["llama3", "qwen2", "qwen3"])
@pytest.mark.parametrize("conv", range(len(CONVERSATIONS)))
def test_chat_prompt_equals_transformers(dirs, family, conv):
    from transformers import PreTrainedTokenizerFast

    ours, theirs = Tokenizer.from_dir(dirs[family]), PreTrainedTokenizerFast.from_pretrained(str(dirs[family]))
    messages = CONVERSATIONS[conv]
    assert ours.apply_chat_template(messages) == theirs.apply_chat_template(messages, tokenize=False,
                                                                            add_generation_prompt=True)
    assert ours.encode_chat(messages) == theirs.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]


def test_llama3_bos_headers_and_stops(dirs):
    tok = Tokenizer.from_dir(dirs["llama3"])
    bos, eot = tok.token_to_id("<|begin_of_text|>"), tok.token_to_id("<|eot_id|>")
    assert tok.encode("hi")[0] == bos  # the post-processor adds BOS to a plain prompt ...
    ids = tok.encode_chat(CONVERSATIONS[0])
    assert ids.count(bos) == 1 and ids[0] == bos  # ... and the template writes it once in a chat prompt
    assert ids[-4:-1] == [tok.token_to_id("<|start_header_id|>"), *tok.encode("assistant", add_special_tokens=False),
                          tok.token_to_id("<|end_header_id|>")][-3:]
    assert eot in tok.eos_token_ids and tok.token_to_id("<|endoftext|>") in tok.eos_token_ids
    stop = StopChecker(tok, SamplingParams(max_tokens=10), tok.eos_token_ids)
    assert stop.append(tok.encode("ok", add_special_tokens=False)[0]).finish_reason is None
    assert stop.append(eot).finish_reason == "stop"  # a turn ends at <|eot_id|>, not only at end-of-text


def test_qwen_chatml_stops_and_thinking_switch(dirs):
    for family in ("qwen2", "qwen3"):
        tok = Tokenizer.from_dir(dirs[family])
        assert tok.encode("hi")[0] != tok.token_to_id("<|im_start|>")  # no BOS for Qwen
        assert set(tok.eos_token_ids) == {tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")}
    qwen3 = Tokenizer.from_dir(dirs["qwen3"])
    assert qwen3.apply_chat_template(CONVERSATIONS[0], enable_thinking=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert "greet back" not in qwen3.apply_chat_template(CONVERSATIONS[1])  # earlier reasoning is dropped
