"""A trace request's prompt as exact token ids.

A hash block id always becomes the same `block_tokens` ids (a generator seeded by the id alone, over
the tokenizer's ordinary vocabulary: no special or added token), so requests share exactly the
prefixes the trace recorded and nothing else. With --block-tokens equal to the page size every block
is one page. The recorded block size says how much of the last block a request had: a Mooncake
prompt of 6,955 tokens in 14 blocks of 512 has 299 tokens in its last one, so with 16-token blocks
it is 13 x 16 + ceil(299 x 16 / 512) = 218 tokens. A prompt with a length and no hash ids gets
blocks of its own. Text (aiperf) is tokenized as is.
"""

from __future__ import annotations

import json
import math
import random

from bench.trace.request import TraceRequest


def ordinary_vocabulary(tokenizer) -> tuple[range, frozenset[int]]:
    """(the id range of ordinary tokens, the added tokens inside it): the added tokens of
    tokenizer.json sit at the start (SmolLM2: 0-16) or at the end (Llama 3, Qwen) of the ids."""
    size = tokenizer.vocab_size
    added = {int(t["id"]) for t in json.loads(tokenizer.to_json()).get("added_tokens") or []}
    lo = max((a + 1 for a in added if a < size // 2), default=0)
    hi = min((a for a in added if a >= size // 2), default=size)
    return range(lo, hi), frozenset(a for a in added if lo <= a < hi)


class BlockTokens:
    def __init__(self, block_tokens: int, vocabulary: range, avoid: frozenset[int] = frozenset()):
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
        self.block_tokens, self.vocabulary, self.avoid = block_tokens, vocabulary, avoid
        self._cache: dict[int | str, list[int]] = {}

    def block(self, block_id: int | str) -> list[int]:
        ids = self._cache.get(block_id)
        if ids is None:
            # NOTE: a str seed is hashed with sha512 by random.Random: the same on every run and machine
            rng = random.Random(f"pdorch-trace-block:{block_id}")
            ids = []
            while len(ids) < self.block_tokens:
                token = self.vocabulary[rng.randrange(len(self.vocabulary))]
                if token not in self.avoid:
                    ids.append(token)
            self._cache[block_id] = ids
        return ids

    def prompt(self, req: TraceRequest, recorded_block_size: int) -> list[int]:
        """The ids of a hash-block request (or of one with only `input_length`)."""
        scale = self.block_tokens / recorded_block_size
        if not req.blocks:
            n = max(1, math.ceil((req.input_length or 1) * scale))
            blocks = [f"request-{req.index}:{j}" for j in range(math.ceil(n / self.block_tokens))]
            return [t for b in blocks for t in self.block(b)][:n]
        last = self.block_tokens
        if req.input_length is not None:
            recorded_last = req.input_length - (len(req.blocks) - 1) * recorded_block_size
            last = min(self.block_tokens, max(1, math.ceil(recorded_last * scale)))
        ids = [t for b in req.blocks[:-1] for t in self.block(b)]
        return ids + self.block(req.blocks[-1])[:last]
