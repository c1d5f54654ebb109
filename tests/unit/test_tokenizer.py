"""engine.tokenizer: round trips, special tokens, the SmolLM2 chat template, clear errors."""

import pytest

from engine.tokenizer import ChatTemplateError, Tokenizer


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return Tokenizer.from_dir(tiny_model_dir)


def test_round_trip_and_digits_split(tok):
    text = "héllo 世界 🎉 it's 2026!"
    assert tok.decode(tok.encode(text)) == text
    digits = tok.encode("12345")
    assert len(digits) == 5 and tok.decode(digits[:1]) == "1"  # smollm: one token per digit


def test_special_tokens_and_eos(tok):
    assert tok.encode("<|im_start|>user<|im_end|>") == [1, 4093, 2]
    assert tok.eos_token_ids == (2,)
    assert tok.decode([1, 4093, 2], skip_special_tokens=True) == "user"


def test_chat_template_renders_default_system_prompt(tok):
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                    "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    no_gen = tok.apply_chat_template([{"role": "system", "content": "S"}], add_generation_prompt=False)
    assert no_gen == "<|im_start|>system\nS<|im_end|>\n"
    assert tok.encode_chat([{"role": "user", "content": "Hi"}])[:3] == [1, 9690, 198]


def test_missing_template_is_a_clear_error(tok):
    bare = Tokenizer(tok._tk, None, None, None, ())
    with pytest.raises(ChatTemplateError, match="no chat template"):
        bare.apply_chat_template([{"role": "user", "content": "x"}])
