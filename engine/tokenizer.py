"""Tokenizer: HF `tokenizers` for text <-> ids, jinja2 for the chat template. Torch-free."""

from __future__ import annotations

import json
import pathlib
from typing import Any

from tokenizers import Tokenizer as _HFTokenizer

from engine.arch import ModelDirError
from engine.chat_template import ChatTemplate, ChatTemplateError

__all__ = ["ChatTemplateError", "Tokenizer"]


def _token_text(value) -> str | None:
    """tokenizer_config.json stores special tokens as strings or as AddedToken dicts."""
    if isinstance(value, dict):
        return value.get("content")
    return value


class Tokenizer:
    def __init__(self, tokenizer: _HFTokenizer, chat_template: str | None, bos_token: str | None,
                 eos_token: str | None, eos_token_ids: tuple[int, ...]):
        self._tk = tokenizer
        self.chat_template = chat_template
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.eos_token_ids = eos_token_ids
        self._template: ChatTemplate | None = None
        self._added: dict[int, str] | None = None

    @classmethod
    def from_dir(cls, model_dir: str | pathlib.Path) -> Tokenizer:
        d = pathlib.Path(model_dir)
        if not (d / "tokenizer.json").is_file():
            raise ModelDirError(f"{d / 'tokenizer.json'} not found: not a prepared model directory")
        tk = _HFTokenizer.from_file(str(d / "tokenizer.json"))
        cfg = _read_json(d / "tokenizer_config.json")
        template = cfg.get("chat_template")
        if isinstance(template, list):  # several named templates: take "default"
            template = {t["name"]: t["template"] for t in template}.get("default")
        if (d / "chat_template.jinja").is_file():
            template = (d / "chat_template.jinja").read_text()
        bos, eos = _token_text(cfg.get("bos_token")), _token_text(cfg.get("eos_token"))
        ids: list[int] = []
        for name in ("generation_config.json", "config.json"):
            value = _read_json(d / name).get("eos_token_id")
            ids += [value] if isinstance(value, int) else list(value or [])
        if eos is not None and tk.token_to_id(eos) is not None:
            ids.append(tk.token_to_id(eos))
        return cls(tk, template, bos, eos, tuple(dict.fromkeys(ids)))

    @property
    def vocab_size(self) -> int:
        return self._tk.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Like HF `tokenizer.encode`: special tokens in the text are recognised; the model's
        post-processor (e.g. a BOS for Llama 3) is applied unless add_special_tokens=False."""
        return self._tk.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self._tk.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def added_token_texts(self) -> dict[int, str]:
        """Each added token's text by id (special or not): what vLLM's spaces_between_special_tokens=False
        writes for one that follows another (engine/stop.py)."""
        if self._added is None:
            self._added = {i: t.content for i, t in self._tk.get_added_tokens_decoder().items()}
        return self._added

    def vocab(self) -> dict[str, int]:
        """Every token as the tokenizer stores it (byte-level tokens encoded as such), added ones too."""
        return self._tk.get_vocab(with_added_tokens=True)

    def to_json(self) -> str:
        """The tokenizer.json text (its model, pre-tokenizer and decoder say how the vocab is encoded)."""
        return self._tk.to_str()

    def token_to_id(self, token: str) -> int | None:
        return self._tk.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tk.id_to_token(token_id)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            continue_final_message: bool = False, **kwargs) -> str:
        if not self.chat_template:
            raise ChatTemplateError("this model has no chat template; use a completion request instead")
        if self._template is None:
            self._template = ChatTemplate(self.chat_template)
        return self._template.render(messages, add_generation_prompt, continue_final_message,
                                     self.bos_token or "", self.eos_token or "", **kwargs)

    def encode_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    continue_final_message: bool = False, **kwargs) -> list[int]:
        """Token ids of a chat prompt; `kwargs`: the template's extra variables (`tools`, ...). NOTE:
        the template already holds any BOS, so the post-processor is off here (as in transformers'
        apply_chat_template(tokenize=True))."""
        text = self.apply_chat_template(messages, add_generation_prompt, continue_final_message, **kwargs)
        return self.encode(text, add_special_tokens=False)


def _read_json(path: pathlib.Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}
