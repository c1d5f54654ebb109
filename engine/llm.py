"""LLM: a single-process reference engine (continuous batching + chunked prefill + L1 prefix
cache) over ModelRunner. Workers build their own loops from the same parts; this one exists
to prove those parts correct together and to benchmark them.

One step:
  1. every running sequence with its prompt done contributes 1 decode token,
  2. sequences still prefilling take chunks from the remaining token budget,
  3. waiting sequences are admitted (prefix-cache match, pages reserved for prompt + max_tokens)
     while budget, batch slots and pages last,
  4. one ModelRunner.forward; sequences whose last chunk ended at their last token sample.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Sequence as Seq

import torch

from engine.kv_pool import KVPool
from engine.loader import load_model
from engine.model_runner import Chunk, ModelRunner
from engine.page_allocator import PageAllocator, pages_for
from engine.sampler import Sampler
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from engine.stop import StopChecker
from engine.tokenizer import Tokenizer
from store_client.page_hash import page_hashes


class LLM:
    def __init__(self, model_dir, num_pages: int = 512, page_size: int = 16, device: str = "cpu",
                 dtype: torch.dtype = torch.float32, kv_dtype: torch.dtype | None = None,
                 max_num_seqs: int = 32, max_num_batched_tokens: int = 512, enable_prefix_cache: bool = True,
                 prefill_chunk_tokens: int | None = None, torch_threads: int | None = None,
                 attention: str = "auto"):
        if torch_threads:
            torch.set_num_threads(torch_threads)
        self.arch, self.model = load_model(model_dir, device=device, dtype=dtype)
        self.tokenizer = Tokenizer.from_dir(model_dir)
        self.pool = KVPool(self.arch, num_pages, page_size, kv_dtype or dtype, device)
        self.allocator = PageAllocator(num_pages)
        self.runner = ModelRunner(self.model, self.arch, self.pool, attention)
        self.sampler = Sampler(self.model.device)
        self.page_size = page_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.prefill_chunk_tokens = prefill_chunk_tokens or max_num_batched_tokens  # per sequence and step
        self.enable_prefix_cache = enable_prefix_cache
        self.eos_token_ids = self.tokenizer.eos_token_ids or self.arch.eos_token_ids
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._ids = itertools.count()

    # -- public API ------------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], params: SamplingParams | Seq[SamplingParams]) -> list[list[int]]:
        """Output token ids per prompt (the finishing eos/stop token included, as HF generate does)."""
        plist = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(plist) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(plist)} SamplingParams")
        seqs = [self.add_request(p, sp) for p, sp in zip(prompts, plist)]
        while self.has_unfinished():
            self.step()
        return [s.output_ids for s in seqs]

    def add_request(self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None) -> Sequence:
        limit = self.arch.max_position_embeddings
        if len(prompt_ids) + params.max_tokens > limit:
            raise ValueError(f"prompt ({len(prompt_ids)}) + max_tokens ({params.max_tokens}) exceeds the "
                             f"model context of {limit} tokens")
        if self._pages_for(len(prompt_ids) + params.max_tokens) > self.allocator.num_total:
            raise ValueError(f"request needs more KV pages than the pool holds ({self.allocator.num_total})")
        bad = [t for t in prompt_ids if not 0 <= t < self.arch.vocab_size]
        if bad:
            raise ValueError(f"prompt token ids {bad[:5]} outside the vocabulary (0..{self.arch.vocab_size - 1})")
        seq = Sequence(request_id or f"req-{next(self._ids)}", prompt_ids, params)
        seq.generator = self.sampler.make_generator(params)
        seq.stop_checker = StopChecker(self.tokenizer, params, self.eos_token_ids)
        self.waiting.append(seq)
        return seq

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def step(self) -> list[Sequence]:
        """Run one batch; returns the sequences that finished in it."""
        budget = self.max_num_batched_tokens
        chunks: list[tuple[Sequence, Chunk]] = []
        for seq in self.running:
            n = min(seq.num_tokens - seq.num_computed_tokens, budget, self.prefill_chunk_tokens)
            if n > 0:
                chunks.append((seq, self._chunk(seq, n)))
                budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and self._admit(self.waiting[0]):
            seq = self.waiting.popleft()
            self.running.append(seq)
            n = min(seq.num_tokens - seq.num_computed_tokens, budget, self.prefill_chunk_tokens)
            chunks.append((seq, self._chunk(seq, n)))
            budget -= n
        if not chunks:
            raise RuntimeError("no progress possible: the pool is too small for the waiting request")
        logits = self.runner.forward([c for _, c in chunks])
        ready = []
        for i, (seq, c) in enumerate(chunks):
            seq.num_computed_tokens = c.end
            self._cache_full_pages(seq)
            if c.end == seq.num_tokens:
                ready.append(i)
        return self._sample(logits, [chunks[i][0] for i in ready], ready)

    # -- internals -------------------------------------------------------------------------------
    def _pages_for(self, n_tokens: int) -> int:
        return pages_for(n_tokens, self.page_size)

    @staticmethod
    def _chunk(seq: Sequence, n: int) -> Chunk:
        start = seq.num_computed_tokens
        return Chunk(seq.page_ids, start, seq.token_ids[start:start + n])

    def _admit(self, seq: Sequence) -> bool:
        """Match the prefix cache and reserve all pages the request can need; False if they don't fit."""
        P = self.page_size
        matched: list[int] = []
        hashes: list[str] = []
        if self.enable_prefix_cache:
            hashes = page_hashes(seq.prompt_ids, P)
            # NOTE: at least one prompt token must be computed to get the first token's logits.
            hashes = hashes[:(seq.prompt_len - 1) // P]
            matched = self.allocator.match_prefix(hashes)
        need = self._pages_for(seq.prompt_len + seq.params.max_tokens) - len(matched)
        if need > self.allocator.num_available():
            self.allocator.release(matched)
            return False
        seq.page_ids = matched + self.allocator.allocate(need)
        seq.page_hashes = hashes[:len(matched)]
        seq.num_computed_tokens = seq.num_cached_tokens = len(matched) * P
        return True

    def _cache_full_pages(self, seq: Sequence) -> None:
        if not self.enable_prefix_cache:
            return
        P, done = self.page_size, len(seq.page_hashes)
        full = seq.num_computed_tokens // P
        if full <= done:
            return
        parent = seq.page_hashes[-1] if seq.page_hashes else ""
        new = page_hashes(seq.token_ids[done * P:full * P], P, parent_hash=parent)
        for i, h in enumerate(new, start=done):
            self.allocator.cache(h, seq.page_ids[i])
        seq.page_hashes.extend(new)

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence], rows: list[int]) -> list[Sequence]:
        if not seqs:
            return []
        tokens = self.sampler.sample(logits[rows], [s.params for s in seqs], [s.generator for s in seqs])
        finished = []
        for seq, tok in zip(seqs, tokens):
            seq.append(tok)
            out = seq.stop_checker.append(tok)
            if out.finish_reason is not None:
                seq.finish_reason = out.finish_reason
                self.running.remove(seq)
                self.allocator.release(seq.page_ids)
                finished.append(seq)
        return finished
