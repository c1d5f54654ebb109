"""Sequence: one request's state inside an engine (docs/design.md section 10: the request object owns
its token ids, num_computed_tokens, page ids and page hashes). Torch-free."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.sampling_params import SamplingParams


@dataclass(eq=False)
class Sequence:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    token_ids: list[int] = field(init=False)      # prompt + output
    num_computed_tokens: int = 0                  # tokens whose K/V are in the pool
    num_cached_tokens: int = 0                    # of those, reused from the prefix cache
    page_ids: list[int] = field(default_factory=list)
    page_hashes: list[str] = field(default_factory=list)  # hashes of the full pages computed so far
    finish_reason: str | None = None
    generator: Any = None                         # torch.Generator when params.seed is set
    stop_checker: Any = None

    def __post_init__(self):
        if not self.prompt_ids:
            raise ValueError(f"request {self.request_id}: empty prompt")
        self.prompt_ids = list(self.prompt_ids)
        self.token_ids = list(self.prompt_ids)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len:]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    def append(self, token_id: int) -> None:
        self.token_ids.append(token_id)
