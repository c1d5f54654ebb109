"""`pdorch serve`'s model before any child starts: converted once with its progress shown, its chat
template tried (a template the router would refuse stops serve at once); the curl it prints."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import TextIO

from pdorch.config import Config


class ServeError(RuntimeError):
    """`pdorch serve` cannot start or keep running; the message says why and where to look."""


def curl_example(url: str, model: str, with_api_key: bool) -> str:
    body = json.dumps({"model": model, "max_tokens": 64, "temperature": 0, "messages": [
        {"role": "user", "content": "What is the capital of France? Answer in one sentence."}]})
    auth = ' -H "Authorization: Bearer $PDORCH_ROUTER_API_KEY"' if with_api_key else ""
    return (f"curl -s {url}/v1/chat/completions -H 'Content-Type: application/json'{auth} \\\n"
            f"  -d {shlex.quote(body)}")


def chat_template_summary(cfg: Config) -> str:
    """The chat template the router will render with (engine/chat_prompts.py), tried before any child
    starts: a model.chat_template the router would refuse stops `pdorch serve` at once."""
    from engine.prepare import prepare_tokenizer  # NOTE: lazy, as above
    from engine.tokenizer import Tokenizer
    from pdorch.config_loader import ConfigError
    from router.http.chat_prompt import chat_prompts

    try:
        return chat_prompts(Tokenizer.from_dir(prepare_tokenizer(cfg.model.source, cfg.model.cache_dir)),
                            cfg.model).setup.describe()
    except ConfigError as e:
        raise ServeError(f"invalid configuration: {e}") from None


def prepare_model_with_progress(cfg: Config, out: TextIO = sys.stdout) -> Path:
    """Convert the model once before any worker starts, so the conversion's progress is visible
    and N workers don't convert it at the same time."""
    from engine.arch import ModelDirError  # NOTE: lazy; the config-only CLI paths stay light
    from engine.prepare import prepare_model
    try:
        return prepare_model(cfg.model.source, cfg.model.cache_dir,
                             progress=lambda msg: print(f"  {msg}", file=out, flush=True))
    except ModelDirError as e:
        raise ServeError(f"model.source: {e}") from None
