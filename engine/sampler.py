"""Sampler: logits [B, vocab] -> one token per row, the whole batch in a few vectorised ops.

    grammar rows         disallowed tokens to -inf first (engine/grammar.py: one batched mask)
    greedy rows          argmax
    the other rows       logits / temperature -> top-k -> top-p -> min-p (each a per-row mask)
                         -> probs, then the exponential race: argmax(probs / E), E ~ Exp(1)
                         (a draw from probs; Gumbel-max written for probabilities)

The noise E of a seeded row comes from that request's own generator, V values a step, whatever
else is in the batch, so a seeded request draws the same tokens alone or in any batch; the
unseeded rows share one draw from the device's default generator. Everything stays on the
logits' device and the batch costs ONE host sync (the final `.tolist()`).

NOTE: generators must live on the logits' device (torch refuses a CPU generator for CUDA
noise): make them with `Sampler.make_generator`, which uses the sampler's device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.grammar import OutputGrammar, mask_rows
from engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class TokenLogprob:
    """A sampled token's log-probability and the most likely alternatives ((id, logprob), best first)."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def make_generator(params: SamplingParams, device="cpu") -> torch.Generator | None:
    """A per-request generator on `device` when the request has a seed, else None."""
    if params.seed is None:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(params.seed)
    return g


class Sampler:
    def __init__(self, device: str | torch.device = "cpu"):
        self.device = torch.device(device)

    def make_generator(self, params: SamplingParams) -> torch.Generator | None:
        return make_generator(params, self.device)

    def sample(self, logits: torch.Tensor, params_list: Sequence[SamplingParams],
               generators: Sequence[torch.Generator | None] | None = None,
               grammars: Sequence[OutputGrammar | None] | None = None) -> list[int]:
        """One token per row. Rows with a grammar (engine/grammar.py) are masked IN PLACE first (the
        callers pass a gathered copy), and each grammar accepts its row's token after."""
        if logits.shape[0] != len(params_list):
            raise ValueError(f"{logits.shape[0]} logit rows for {len(params_list)} requests")
        generators = list(generators or [None] * len(params_list))
        for g in generators:
            if g is not None and g.device.type != logits.device.type:
                raise ValueError(f"a sampling generator on {g.device} for logits on {logits.device}: "
                                 "make generators with Sampler.make_generator")
        if grammars:
            mask_rows(logits, grammars)
        tokens = logits.argmax(dim=-1)
        rows = [i for i, p in enumerate(params_list) if not p.greedy]
        if rows:
            picked = self._sample_rows(logits[rows].float(), [params_list[i] for i in rows],
                                       [generators[i] for i in rows])
            tokens[torch.as_tensor(rows, device=logits.device)] = picked
        out = tokens.tolist()
        for g, t in zip(grammars or (), out):
            if g is not None:
                g.accept(t)
        return out

    @staticmethod
    def logprobs(logits: torch.Tensor, tokens: Sequence[int], params_list: Sequence[SamplingParams]
                 ) -> list[TokenLogprob | None]:
        """Each row's sampled token's logprob and its `params.logprobs` alternatives (None for rows
        that asked for none): the log-softmax of `logits` as the sampler got them (after any grammar
        mask, before temperature and top-k/p, as vLLM's raw logprobs)."""
        rows = [i for i, p in enumerate(params_list) if p.logprobs is not None]
        out: list[TokenLogprob | None] = [None] * len(params_list)
        if not rows:
            return out
        lp = torch.log_softmax(logits[rows].float(), dim=-1)
        chosen = lp.gather(1, torch.as_tensor([tokens[i] for i in rows], device=lp.device)[:, None])
        top = torch.topk(lp, max(params_list[i].logprobs for i in rows), dim=-1)
        values = torch.cat([chosen, top.values], dim=1).tolist()  # [chosen, best, second, ...] per row
        ids = top.indices.tolist()
        for j, i in enumerate(rows):
            n = params_list[i].logprobs  # NOTE: tokens a grammar forbids (-inf) are no alternatives
            top = tuple((t, v) for t, v in zip(ids[j][:n], values[j][1:n + 1]) if v != float("-inf"))
            out[i] = TokenLogprob(values[j][0], top)
        return out

    @staticmethod
    def _sample_rows(x: torch.Tensor, params: list[SamplingParams], gens: list) -> torch.Tensor:
        dev, (n, vocab) = x.device, x.shape

        def column(values, dtype=torch.float32):
            return torch.tensor(values, dtype=dtype, device=dev)[:, None]

        x = x / column([p.temperature for p in params])
        ks = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
        if min(ks) < vocab:
            kmax = max(k for k in ks if k < vocab)
            top = torch.topk(x, kmax, dim=-1).values                         # [n, kmax], descending
            kth = top.gather(1, column([min(k, kmax) - 1 for k in ks], torch.long))
            kth = torch.where(column([k < vocab for k in ks], torch.bool), kth, float("-inf"))
            x = x.masked_fill(x < kth, float("-inf"))
        top_p = [p.top_p for p in params]
        if min(top_p) < 1.0:
            probs, idx = torch.sort(torch.softmax(x, dim=-1), dim=-1, descending=True)
            # Keep the smallest set whose mass reaches top_p: drop a token when the mass before it
            # already does (the top token always stays).
            drop_sorted = (probs.cumsum(-1) - probs) >= column(top_p)
            x = x.masked_fill(torch.zeros_like(drop_sorted).scatter(1, idx, drop_sorted), float("-inf"))
        probs = torch.softmax(x, dim=-1)
        min_p = [p.min_p for p in params]
        if max(min_p) > 0.0:  # drop tokens below min_p x the row's top probability
            probs = probs.masked_fill(probs < column(min_p) * probs.amax(-1, keepdim=True), 0.0)
        noise = torch.empty_like(probs)
        unseeded = [i for i, g in enumerate(gens) if g is None]
        if len(unseeded) == n:
            noise.exponential_()
        else:
            if unseeded:
                noise[unseeded] = torch.empty(len(unseeded), vocab, device=dev).exponential_()
            for i, g in enumerate(gens):
                if g is not None:
                    noise[i].exponential_(generator=g)
        # NOTE: E can be exactly 0; the floor keeps a zero-probability token at 0 / floor = 0.
        return (probs / noise.clamp_min_(1e-30)).argmax(dim=-1)
