"""Sampler: logits [B, vocab] -> one token per row (greedy, temperature, top-k, top-p, seed)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.sampling_params import SamplingParams


def make_generator(params: SamplingParams, device="cpu") -> torch.Generator | None:
    """A per-request generator when the request has a seed, else None (the global RNG)."""
    if params.seed is None:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(params.seed)
    return g


class Sampler:
    def sample(self, logits: torch.Tensor, params_list: Sequence[SamplingParams],
               generators: Sequence[torch.Generator | None] | None = None) -> list[int]:
        if logits.shape[0] != len(params_list):
            raise ValueError(f"{logits.shape[0]} logit rows for {len(params_list)} requests")
        generators = generators or [None] * len(params_list)
        out = logits.argmax(dim=-1).tolist()
        for i, p in enumerate(params_list):
            if not p.greedy:
                out[i] = self._sample_row(logits[i].float(), p, generators[i])
        return out

    @staticmethod
    def _sample_row(row: torch.Tensor, p: SamplingParams, gen: torch.Generator | None) -> int:
        row = row / p.temperature
        if 0 < p.top_k < row.shape[0]:
            kth = torch.topk(row, p.top_k).values[-1]
            row = row.masked_fill(row < kth, float("-inf"))
        if p.top_p < 1.0:
            probs, idx = torch.sort(torch.softmax(row, dim=-1), descending=True)
            # Keep the smallest set whose mass reaches top_p: drop a token when the mass before
            # it already does (the top token always stays).
            drop = (probs.cumsum(-1) - probs) >= p.top_p
            row = row.clone()
            row[idx[drop]] = float("-inf")
        probs = torch.softmax(row, dim=-1)
        return int(torch.multinomial(probs, 1, generator=gen))
