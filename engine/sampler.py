"""Sampler: logits [B, vocab] -> one token per row, the whole batch in a few vectorised ops.

    grammar rows         disallowed tokens to -inf first (engine/grammar.py: one batched mask)
    controlled rows      penalties, logit_bias, then the request's token masks, each only where it
                         leaves a token: the grammar wins over allowed_token_ids, bad_words and
                         min_tokens (apply_controls); a row with no token left at all is an error
    greedy rows          argmax
    the other rows       logits / temperature -> top-k -> top-p -> min-p (each a per-row mask)
                         -> probs, then the exponential race: argmax(probs / E), E ~ Exp(1)
                         (a draw from probs; Gumbel-max written for probabilities)

The noise E of a seeded row comes from that request's own generator, V values a step, whatever
else is in the batch, so a seeded request draws the same tokens alone or in any batch; the
unseeded rows share one draw from the device's default generator. Everything stays on the
logits' device and the batch costs ONE host sync (the final `.tolist()`); the rows' parameters are
copied to the device once per change of the batch's parameters (SampledRows), not every step.

NOTE: generators must live on the logits' device (torch refuses a CPU generator for CUDA
noise): make them with `Sampler.make_generator`, which uses the sampler's device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.grammar import OutputGrammar, mask_rows
from engine.sampling_params import SamplingParams
from engine.token_masks import apply_token_masks


class TokenCounts:
    """One request's token counts on the logits' device, [2, vocab] float32: row 0 over the prompt and
    the output (the repetition penalty), row 1 over the output (frequency / presence), for its first
    `length` tokens. A worker keeps one with each request and passes it in the TokenHistory, so a
    step counts only the tokens since the last one instead of the whole history again (a host list
    of thousands of ids turned into a tensor per row per step). It is trusted only for the same
    `token_ids` object, grown, with the same output start; anything else is counted afresh."""

    def __init__(self):
        self.table: torch.Tensor | None = None
        self.length = 0
        self.of: tuple = ()  # (token_ids object, output_start, vocab, device) the table counts


@dataclass(frozen=True)
class TokenHistory:
    """What the sampling controls of one row read (SamplingParams.needs_history): its tokens so far
    (prompt, then output from `output_start`), the ids min_tokens keeps out (EOS, stop tokens) and
    the request's TokenCounts (None: counted from the whole history)."""

    token_ids: Sequence[int]
    output_start: int
    stop_ids: tuple[int, ...] = ()
    counts: TokenCounts | None = None


@dataclass(frozen=True)
class TokenLogprob:
    """A sampled token's log-probability and the most likely alternatives ((id, logprob), best first)."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    rank: int | None = None  # 1 + how many tokens are more likely (asked for prompt logprobs only)


def make_generator(params: SamplingParams, device="cpu") -> torch.Generator | None:
    """A per-request generator on `device` when the request has a seed, else None."""
    if params.seed is None:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(params.seed)
    return g


@dataclass(frozen=True)
class SampledRows:
    """The rows of a batch that sample (not greedy) and their parameters, on the logits' device.
    Built once per change of the batch's parameters (Sampler keeps the last), so a steady decode
    batch copies nothing to the device to sample: two copies when its composition changes."""

    rows: torch.Tensor          # [n] long: which rows of the batch sample
    temperature: torch.Tensor   # [n, 1]
    top_p: torch.Tensor | None  # [n, 1]; None: no row below 1
    min_p: torch.Tensor | None  # [n, 1]; None: no row above 0
    kmax: int                   # the largest top-k below the vocabulary; 0: no row has one
    kth: torch.Tensor | None    # [n, 1] long: min(k, kmax) - 1, the column of each row's k-th largest logit
    has_k: torch.Tensor | None  # [n, 1] bool: the row has a top-k below the vocabulary
    unseeded: torch.Tensor | None  # [u] long: the rows (of the n) without a seed; None: every row or none
    unseeded_rows: tuple[int, ...] = ()  # the same on the host

    @staticmethod
    def build(params_list: Sequence[SamplingParams], vocab: int, device: torch.device) -> SampledRows | None:
        rows = [i for i, p in enumerate(params_list) if not p.greedy]
        if not rows:
            return None
        ps = [params_list[i] for i in rows]
        ks = [p.top_k if 0 < p.top_k < vocab else vocab for p in ps]
        kmax = max((k for k in ks if k < vocab), default=0)
        unseeded = [j for j, p in enumerate(ps) if p.seed is None]
        n = len(ps)
        floats = torch.tensor([[p.temperature for p in ps], [p.top_p for p in ps], [p.min_p for p in ps]],
                              dtype=torch.float32).to(device).unsqueeze(-1)      # [3, n, 1]: one copy
        ints = torch.tensor([rows, [min(k, kmax) - 1 for k in ks], [k < vocab for k in ks],
                             unseeded + [0] * (n - len(unseeded))], dtype=torch.long).to(device)  # one copy
        return SampledRows(rows=ints[0], temperature=floats[0],
                           top_p=floats[1] if min(p.top_p for p in ps) < 1.0 else None,
                           min_p=floats[2] if max(p.min_p for p in ps) > 0.0 else None,
                           kmax=kmax, kth=ints[1][:, None] if kmax else None,
                           has_k=ints[2][:, None].bool() if kmax else None,
                           unseeded=ints[3][:len(unseeded)] if 0 < len(unseeded) < n else None,
                           unseeded_rows=tuple(unseeded))


class Sampler:
    def __init__(self, device: str | torch.device = "cpu"):
        self.device = torch.device(device)
        self._staged: tuple = (None, None)  # (the last batch's (params, vocab, device), its SampledRows)

    def make_generator(self, params: SamplingParams) -> torch.Generator | None:
        return make_generator(params, self.device)

    def sampled_rows(self, params_list: Sequence[SamplingParams], vocab: int, device: torch.device
                     ) -> SampledRows | None:
        """The batch's SampledRows: the last ones while the parameters are the same (a steady batch)."""
        key = (tuple(params_list), vocab, device)
        if self._staged[0] != key:
            self._staged = (key, SampledRows.build(params_list, vocab, device))
        return self._staged[1]

    def sample(self, logits: torch.Tensor, params_list: Sequence[SamplingParams],
               generators: Sequence[torch.Generator | None] | None = None,
               grammars: Sequence[OutputGrammar | None] | None = None,
               histories: Sequence[TokenHistory | None] | None = None) -> list[int]:
        """One token per row. Rows with a grammar (engine/grammar.py) are masked IN PLACE first (the
        callers pass a gathered copy), and each grammar accepts its row's token after. Rows whose
        params need it get the penalties, logit_bias and the token masks (allowed_token_ids, bad_words,
        min_tokens) from their `histories` entry, on a copy (the logits stay as the logprobs report
        them). A masked row left with no finite logit raises RuntimeError: no row samples from nothing."""
        if logits.shape[0] != len(params_list):
            raise ValueError(f"{logits.shape[0]} logit rows for {len(params_list)} requests")
        generators = list(generators or [None] * len(params_list))
        for g in generators:
            if g is not None and g.device.type != logits.device.type:
                raise ValueError(f"a sampling generator on {g.device} for logits on {logits.device}: "
                                 "make generators with Sampler.make_generator")
        masked = bool(grammars) and any(g is not None for g in grammars)
        if masked:
            mask_rows(logits, grammars)
        raw, logits = logits, apply_controls(logits, params_list, histories)
        masked = masked or logits is not raw  # some row has a grammar or a control: -inf is possible
        tokens = logits.argmax(dim=-1)
        sampled = self.sampled_rows(params_list, logits.shape[-1], logits.device)
        if sampled is not None:
            gens = [generators[i] for i, p in enumerate(params_list) if not p.greedy]
            tokens[sampled.rows] = self._sample_rows(logits[sampled.rows].float(), sampled, gens)
        if masked:  # NOTE: -1 marks a row left with no token at all (or NaN); checked after the one sync below
            tokens = torch.where((logits > float("-inf")).any(-1), tokens, -1)
        out = tokens.tolist()  # the one host sync of a step
        if masked and min(out) < 0:
            dead = [i for i, t in enumerate(out) if t < 0]
            raise RuntimeError(f"sampler: rows {dead} have no token to sample (every logit -inf or NaN after "
                               "the grammar's mask): a bug, never a token drawn from nothing")
        for g, t in zip(grammars or (), out):
            if g is not None:
                g.accept(t)
        return out

    @staticmethod
    def logprobs(logits: torch.Tensor, tokens: Sequence[int], params_list: Sequence[SamplingParams],
                 ranks: bool = False) -> list[TokenLogprob | None]:
        """Each row's sampled token's logprob and its `params.logprobs` alternatives (None for rows
        that asked for none): the log-softmax of `logits` as the sampler got them (after any grammar
        mask, before temperature and top-k/p, as vLLM's raw logprobs). `ranks`: each token's rank too."""
        rows = [i for i, p in enumerate(params_list) if p.logprobs is not None]
        out: list[TokenLogprob | None] = [None] * len(params_list)
        if not rows:
            return out
        lp = torch.log_softmax(logits[rows].float(), dim=-1)
        chosen = lp.gather(1, torch.as_tensor([tokens[i] for i in rows], device=lp.device)[:, None])
        top = torch.topk(lp, max(params_list[i].logprobs for i in rows), dim=-1)
        parts = [chosen, top.values]
        if ranks:  # NOTE: as a float column, so the rows still come back in one copy
            parts.append((lp > chosen).sum(-1, keepdim=True).float() + 1)
        values = torch.cat(parts, dim=1).tolist()  # [chosen, best, second, ..., (rank)] per row
        ids = top.indices.tolist()
        for j, i in enumerate(rows):
            n = params_list[i].logprobs  # NOTE: tokens a grammar forbids (-inf) are no alternatives
            top = tuple((t, v) for t, v in zip(ids[j][:n], values[j][1:n + 1]) if v != float("-inf"))
            out[i] = TokenLogprob(values[j][0], top, int(values[j][-1]) if ranks else None)
        return out

    @staticmethod
    def _sample_rows(x: torch.Tensor, sr: SampledRows, gens: list) -> torch.Tensor:
        n, vocab = x.shape
        dev = x.device
        x = x / sr.temperature
        if sr.kmax:
            top = torch.topk(x, sr.kmax, dim=-1).values                      # [n, kmax], descending
            kth = torch.where(sr.has_k, top.gather(1, sr.kth), float("-inf"))
            x = x.masked_fill(x < kth, float("-inf"))
        if sr.top_p is not None:
            probs, idx = torch.sort(torch.softmax(x, dim=-1), dim=-1, descending=True)
            # Keep the smallest set whose mass reaches top_p: drop a token when the mass before it
            # already does (the top token always stays).
            drop_sorted = (probs.cumsum(-1) - probs) >= sr.top_p
            x = x.masked_fill(torch.zeros_like(drop_sorted).scatter(1, idx, drop_sorted), float("-inf"))
        probs = torch.softmax(x, dim=-1)
        if sr.min_p is not None:  # drop tokens below min_p x the row's top probability
            probs = probs.masked_fill(probs < sr.min_p * probs.amax(-1, keepdim=True), 0.0)
        noise = torch.empty_like(probs)
        unseeded = tuple(i for i, g in enumerate(gens) if g is None)  # a caller may pass no generator
        if len(unseeded) == n:
            noise.exponential_()
        else:
            if unseeded:
                index = sr.unseeded if unseeded == sr.unseeded_rows else torch.as_tensor(unseeded, device=dev)
                noise[index] = torch.empty(len(unseeded), vocab, device=dev).exponential_()
            for i, g in enumerate(gens):
                if g is not None:
                    noise[i].exponential_(generator=g)
        # NOTE: E can be exactly 0; the floor keeps a zero-probability token at 0 / floor = 0.
        return (probs / noise.clamp_min_(1e-30)).argmax(dim=-1)


def apply_controls(logits: torch.Tensor, params_list: Sequence[SamplingParams],
                   histories: Sequence[TokenHistory | None] | None) -> torch.Tensor:
    """vLLM's definitions, for the rows that need them, batched: a repetition penalty p on every
    token of the prompt and the output (logit / p where positive, x p where not), then
    logit -= frequency_penalty x count + presence_penalty x (count > 0) over the output's tokens,
    + logit_bias, then the token masks: only allowed_token_ids, no bad word's last token, no EOS /
    stop token while the output is shorter than min_tokens, each where it leaves a token (_narrow).
    Returns `logits` itself when no row needs any, else a copy."""
    rows = [i for i, p in enumerate(params_list) if p.needs_history]
    if not rows:
        return logits
    if histories is None or any(histories[i] is None for i in rows):
        raise ValueError("sampling controls (penalties, logit_bias, min_tokens) need the rows' TokenHistory")
    x, dev, vocab = logits.clone(), logits.device, logits.shape[-1]
    ps, hs = [params_list[i] for i in rows], [histories[i] for i in rows]
    index = torch.as_tensor(rows, device=dev)
    sub = x[index].float()

    def column(values) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float32, device=dev)[:, None]

    # NOTE: only the rows with a penalty are counted (logit_bias / min_tokens rows need no counts)
    pen = [j for j, p in enumerate(ps) if p.repetition_penalty != 1.0 or p.frequency_penalty or p.presence_penalty]
    if pen:
        pps = [ps[j] for j in pen]
        rep, freq, pres = [p.repetition_penalty for p in pps], [p.frequency_penalty for p in pps], \
            [p.presence_penalty for p in pps]
        counts = history_counts([hs[j] for j in pen], vocab, dev)  # [pen, 2, vocab]: every token, the output's
        some = torch.as_tensor(pen, device=dev) if len(pen) < len(ps) else None
        s = sub if some is None else sub[some]
        if any(r != 1.0 for r in rep):  # x / 1 and x * 1 are x: rows without one are unchanged
            r = column(rep)
            s = torch.where(counts[:, 0] > 0, torch.where(s > 0, s / r, s * r), s)
        if any(freq) or any(pres):
            c = counts[:, 1]
            s = s - column(freq) * c - column(pres) * (c > 0).float()
        if some is None:
            sub = s
        else:
            sub[some] = s
    for r, p in enumerate(ps):
        if p.logit_bias:
            ids = torch.as_tensor([t for t, _ in p.logit_bias if 0 <= t < vocab], dtype=torch.long, device=dev)
            bias = torch.as_tensor([b for t, b in p.logit_bias if 0 <= t < vocab], device=dev)
            sub[r].index_add_(0, ids, bias)
    apply_token_masks(sub, ps, hs, vocab)
    x[index] = sub.to(x.dtype)
    return x


def history_counts(hs: Sequence[TokenHistory], vocab: int, dev: torch.device) -> torch.Tensor:
    """[rows, 2, vocab] float32: per row, how often each id occurs in its tokens and in its output.
    Rows with a TokenCounts add only their tokens since its last step (and keep the result); one
    index_put for the whole batch, one multi-tensor copy back into the requests' tables."""
    kept, fresh = [], []  # (row, TokenCounts) with a table to update / to make
    rows: list[TokenCounts] = []
    taken: set[int] = set()
    new_ids: list[int] = []  # every row's tokens since its table's last step, row after row
    segs: list[tuple[int, int, int]] = []  # per row: (new tokens, position of the first, output start)
    for r, h in enumerate(hs):
        keep = h.counts is not None and id(h.counts) not in taken  # a table counts one row
        c = h.counts if keep else TokenCounts()  # no TokenCounts of its own: counted, not kept
        rows.append(c)
        taken.add(id(c))
        of = (h.token_ids, h.output_start, vocab, dev)
        if c.table is None or c.length > len(h.token_ids) or c.of[0] is not h.token_ids or c.of[1:] != of[1:]:
            c.table, c.length, c.of = None, 0, of  # not this history's counts: from its first token
        new_ids.extend(h.token_ids[c.length:])  # NOTE: one list, one tensor: no Python loop per token
        segs.append((len(h.token_ids) - c.length, c.length, h.output_start))
        c.length = len(h.token_ids)
        if c.table is not None:
            kept.append((r, c))
        elif keep:
            fresh.append((r, c))
    zeros = torch.zeros(2, vocab, device=dev)
    tables = torch.stack([c.table if c.table is not None else zeros for c in rows])
    if new_ids:
        t = torch.tensor(new_ids, dtype=torch.long)
        n, first, start = torch.tensor(segs, dtype=torch.long).T
        row = torch.repeat_interleave(torch.arange(len(segs)), n)
        pos = torch.arange(len(new_ids)) + torch.repeat_interleave(first - (torch.cumsum(n, 0) - n), n)
        start = torch.repeat_interleave(start, n)
        valid = (t >= 0) & (t < vocab)
        out = valid & (pos >= start)  # an output token counts in both tables
        index = torch.cat([torch.stack((row[m], torch.full_like(row[m], kind), t[m]))
                           for kind, m in ((0, valid), (1, out))], dim=1).to(dev)  # one host-to-device copy
        tables.index_put_((index[0], index[1], index[2]), torch.ones(index.shape[1], device=dev), accumulate=True)
    if kept:  # NOTE: copied back, not views of `tables`: a request that leaves must not keep the batch's
        torch._foreach_copy_([c.table for _, c in kept], [tables[r] for r, _ in kept])
    for r, c in fresh:
        c.table = tables[r].clone()
    return tables
