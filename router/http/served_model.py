"""The served model's names: what a client may send as `model`, and the 404 for any other. A handler
checks its body's `model` here, once, before the request's work starts."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from router.errors import APIError


def model_aliases(name: str, source: str, model_dir: Path | None) -> frozenset[str]:
    """Names a client may send as `model`: the served name, the source, the prepared dir, and
    each one's last path component (SGLang's bench_multiturn sends --model-path)."""
    names = {name, source, "default"}
    if model_dir is not None:
        names.add(str(model_dir))
    names |= {os.path.basename(os.path.normpath(n)) for n in list(names) if n}
    return frozenset(n for n in names if n)


@dataclass(frozen=True, slots=True)
class ServedModel:
    name: str  # model.served_name: what the answers say
    aliases: frozenset[str]

    @classmethod
    def of(cls, name: str, source: str, model_dir: Path | None) -> ServedModel:
        return cls(name, model_aliases(name, source, model_dir))

    def check(self, model: str | None) -> None:
        """404 naming `model` unless it names the served model (None: no `model` field, the served one)."""
        if model is None:
            return
        if model not in self.aliases and os.path.basename(os.path.normpath(model)) not in self.aliases:
            raise APIError(404, f"model {model!r} is not served here; this router serves {self.name!r}",
                           "invalid_request_error", "model", "model_not_found")
