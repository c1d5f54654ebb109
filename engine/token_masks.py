"""A request's own token masks: allowed_token_ids, bad_words, min_tokens (engine/sampler.py applies them
after the penalties and logit_bias, on the rows that have any).

Each mask is a layer, applied in this order, and each applies to a row only where it leaves the row
a token to sample: none of them can take away the last token a grammar allows, so the grammar wins
(a JSON that may only end now ends, whatever min_tokens says), then allowed_token_ids, bad_words,
min_tokens. Without that rule a grammar that allows only EOS under min_tokens left every logit at
-inf, and argmax drew token 0. A layer gives (row, token) pairs: the tokens a row keeps
(allowed_token_ids) or loses (the others); one boolean mask per layer for its rows, on the logits'
device, no host sync.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from engine.sampler import TokenHistory

# (keep, (row, token) pairs): keep=True, the pairs are the tokens their rows keep (every other one is
# banned); keep=False, the tokens their rows lose
Layer = tuple[bool, list[tuple[int, int]]]


def apply_token_masks(sub: torch.Tensor, ps: Sequence[SamplingParams], hs: Sequence[TokenHistory], vocab: int
                      ) -> None:
    """The layers on `sub` ([rows, vocab], row r under ps[r] with history hs[r]) in place."""
    for layer in (_allowed, _bad_words, _min_tokens):
        _narrow(sub, layer(ps, hs, vocab), vocab)


def _allowed(ps, hs, vocab: int) -> Layer:
    return True, [(r, t) for r, p in enumerate(ps) for t in p.allowed_token_ids if 0 <= t < vocab]


def _bad_words(ps, hs, vocab: int) -> Layer:
    """vLLM's bad_words: a word's last token is banned where the output ends with the rest of it."""
    out = []
    for r, (p, h) in enumerate(zip(ps, hs)):
        if not p.bad_words:
            continue
        produced = len(h.token_ids) - h.output_start
        longest = max(len(w) for w in p.bad_words) - 1
        tail = tuple(h.token_ids[len(h.token_ids) - min(longest, produced):])  # NOTE: the tail only, not the output
        out += [(r, w[-1]) for w in p.bad_words
                if len(w) - 1 <= produced and tail[len(tail) - len(w) + 1:] == w[:-1] and 0 <= w[-1] < vocab]
    return False, out


def _min_tokens(ps, hs, vocab: int) -> Layer:
    """EOS and stop tokens while the output is shorter than min_tokens. A resumed stream's min_tokens
    was lowered by the tokens already streamed (router/dispatch/failover.py), which its history
    counts as output too (resumed_tokens): the two together are the request's own min_tokens."""
    return False, [(r, t) for r, (p, h) in enumerate(zip(ps, hs))
                   if p.min_tokens and len(h.token_ids) - h.output_start < p.min_tokens + p.resumed_tokens
                   for t in h.stop_ids if 0 <= t < vocab]


def _narrow(sub: torch.Tensor, layer: Layer, vocab: int) -> None:
    """One mask layer on `sub` in place: (keep, pairs) -> the rows named in `pairs` lose the tokens
    not listed (keep) or listed (ban), each row only where that leaves it a finite logit."""
    keep, pairs = layer
    if not pairs:
        return
    dev = sub.device
    rows = sorted({r for r, _ in pairs})
    at = {r: j for j, r in enumerate(rows)}
    n = len(pairs)
    ids = torch.tensor([at[r] for r, _ in pairs] + [t for _, t in pairs] + rows, dtype=torch.long).to(dev)  # one copy
    banned = torch.full((len(rows), vocab), keep, dtype=torch.bool, device=dev)
    banned[ids[:n], ids[n:2 * n]] = not keep
    index = ids[2 * n:]
    before = sub[index]
    after = before.masked_fill(banned, float("-inf"))
    sub[index] = torch.where((after > float("-inf")).any(-1, keepdim=True), after, before)
