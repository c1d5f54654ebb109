"""How many pages the decode worker's admission keeps back for the growth of the requests it runs.

A decode request grows by one page every `page_size` tokens until it ends; admission sees only its
prompt. Reserving every request's whole `max_tokens` wastes the pool (most requests stop early, at
EOS), reserving nothing makes preemption the normal case. So, as SGLang's scheduler does with its
`new_token_ratio`, admission reserves a FRACTION of what the admitted requests may still grow:

    reserved pages = ceil(ratio * sum over admitted requests of their remaining growth in pages)
    growth of one request = pages for min(prompt + max_tokens, max_context) - pages it holds,
                            its max_tokens clipped at CLIP_TOKENS (a request without max_tokens
                            would otherwise reserve its whole context)

`ratio` starts at `decode.growth_reserve` and falls linearly to `decode.growth_reserve_min` over
DECAY_STEPS decode steps without a preemption (requests do stop early: the reserve was too
cautious); every preemption puts it back to the start (the pool ran dry: it was not cautious
enough). 0 turns the reserve off (admission checks only the prompt's pages, as before preemption).

Pure: no threads, no allocator (decode_node/scheduler.py sums the growth, admission applies it).
"""

from __future__ import annotations

import math

from engine.page_allocator import pages_for

DECAY_STEPS = 600  # SGLang's default decay: from the start to the floor in 600 decode steps
CLIP_TOKENS = 4096  # SGLang's clip of max_new_tokens for this estimate


def growth_pages(prompt_len: int, max_tokens: int, max_context: int, held_pages: int, page_size: int) -> int:
    """Pages a request may still need beyond the `held_pages` it has (at least 0)."""
    end = min(prompt_len + min(max_tokens, CLIP_TOKENS), max_context)
    return max(0, pages_for(end, page_size) - held_pages)


class GrowthReserve:
    def __init__(self, start: float, floor: float, decay_steps: int = DECAY_STEPS):
        if not 0.0 <= floor <= start <= 1.0:
            raise ValueError(f"growth reserve: need 0 <= floor ({floor}) <= start ({start}) <= 1")
        self.start, self.floor = start, floor
        self._decay = (start - floor) / max(decay_steps, 1)
        self.ratio = start

    def stepped(self) -> None:
        """One decode step ran without a preemption."""
        self.ratio = max(self.floor, self.ratio - self._decay)

    def preempted(self) -> None:
        """The pool ran dry: be as cautious as at the start again."""
        self.ratio = self.start

    def pages(self, growth: int) -> int:
        """Pages to keep back for `growth` pages the admitted requests may still need."""
        return math.ceil(self.ratio * growth - 1e-9) if growth > 0 else 0
