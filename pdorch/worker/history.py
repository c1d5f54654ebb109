"""What the sampling controls of one request read (engine/sampler.py TokenHistory), on either worker."""

from __future__ import annotations

from collections.abc import Sequence

from engine.sampler import TokenCounts, TokenHistory
from engine.sampling_params import SamplingParams


def token_history(eos_token_ids: Sequence[int], params: SamplingParams, token_ids: Sequence[int],
                  prompt_len: int, counts: TokenCounts | None = None) -> TokenHistory | None:
    """None unless the params need it (penalties, logit_bias, min_tokens). `token_ids`: the prompt
    then the output so far; the prompt's last `params.resumed_tokens` are output too (failover).
    `counts`: the request's own TokenCounts, step after step (decode), so a step counts only its new tokens."""
    if not params.needs_history:
        return None
    stop = tuple(params.stop_token_ids) + (() if params.ignore_eos else tuple(eos_token_ids))
    return TokenHistory(token_ids, prompt_len - params.resumed_tokens, stop, counts)
