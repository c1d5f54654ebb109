"""Where each page of a prompt's KV comes from on the decode worker, decided per request before P
is called (decode_node/prompt_kv.py gathers what the decision needs), and what D is left to compute
once its own store read has landed.

    held    = reusable pages found in D's own prefix cache at admission (decode_node/admission.py)
    present = store.present(keys of the other reusable pages)   one batch_is_exist (~1 ms)
    left    = prompt tokens in neither (holes + tail)

    held or present, left <= decode.max_local_prefill_tokens -> local:   D reads the present pages and
                                                                         computes the rest in its batch
    otherwise                                                -> prefill: P computes; it pushes neither
          the held pages nor (with decode.load_prefix_from_store) the present ones, which D reads
          WHILE P works; P may read the held pages from D's pool for its own attention

A page D fails to read after all (evicted since the check) D computes itself: it costs only itself.

Pure: no store, no threads (the plan is applied to the request by PromptKV.finish).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from decode_node.request import DecodeRequest
from pdorch.worker.prefill_rpc import CachedTokens
from pdorch.worker.prompt_pages import compute_ranges, computed_full_pages, reusable_pages

if TYPE_CHECKING:  # the plan only carries the read; prefix_load.py runs it
    from decode_node.prefix_load import PrefixLoad

LOCAL = "local"
PREFILL = "prefill"
# Why: store_off (no store), store_slow (the existence check did not answer in time), no_prefix
# (no reusable page in the store nor in D's prefix cache), local_off (threshold 0), long_tail (more
# left than the threshold), short_tail (local), prompt_logprobs (P computes the whole prompt: every
# position's logits are asked for).
REASONS = {LOCAL: ("short_tail",),
           PREFILL: ("store_off", "store_slow", "no_prefix", "local_off", "long_tail", "prompt_logprobs")}


class Source(enum.Enum):
    """Where one prompt page's KV comes from."""

    HELD = "held"  # D's own prefix cache (decode_node/prefix_cache.py): already in its page
    STORE = "store"  # D's own store read (decode_node/prefix_load.py); computed here if it fails
    PREFILL = "prefill"  # P computes it and pushes it into D's page
    HERE = "here"  # D's own forward, in its decode batch (decode_node/scheduler.py)


@dataclass(frozen=True)
class PromptPlan:
    where: str  # LOCAL or PREFILL
    reason: str
    load: tuple[int, ...] = ()  # reusable page indexes D reads from the store itself
    held: tuple[int, ...] = ()  # reusable page indexes D's own prefix cache holds
    # D's own store read of `load`, once started (PromptKV.prepare); not part of the decision
    read: PrefixLoad | None = field(default=None, compare=False)

    @property
    def local(self) -> bool:
        return self.where == LOCAL

    def sources(self, num_pages: int) -> list[Source]:
        """Where each of the first `num_pages` prompt pages comes from (before D's own read landed)."""
        held, stored = set(self.held), set(self.load)
        rest = Source.HERE if self.local else Source.PREFILL
        return [Source.HELD if i in held else Source.STORE if i in stored else rest for i in range(num_pages)]

    def not_from_prefill(self) -> tuple[int, ...]:
        """The pages P neither computes nor pushes (D holds or reads them), in order."""
        return tuple(sorted(set(self.held) | set(self.load)))

    def apply(self, req: DecodeRequest, landed: Sequence[bool], page_size: int, from_ssd: Sequence[bool] = ()) -> None:
        """Leave in `req` what D computes itself before decoding, given per `load` page whether D's
        read landed (and whether it came from the store's SSD tier): every reusable page planned here
        and every page it failed to read; locally also the tail (and the first token), after P
        nothing else."""
        n = req.prompt_len
        read = {i for i, good in zip(self.load, landed) if good}
        n_ssd = sum(1 for good, disk in zip(landed, from_ssd) if good and disk)
        holes = [i for i, source in enumerate(self.sources(reusable_pages(n, page_size)))
                 if source is Source.HERE or (source is Source.STORE and i not in read)]
        if self.local:
            req.compute.plan(compute_ranges(holes, n, page_size), computed_full_pages(holes, n, page_size),
                             sample_first=True)
            req.cached = CachedTokens(device=(len(self.held) - req.inflight_pages) * page_size,
                                      store=(len(read) - n_ssd) * page_size, ssd=n_ssd * page_size,
                                      inflight=req.inflight_pages * page_size)
            return
        req.compute.plan([[i * page_size, (i + 1) * page_size] for i in holes], holes)


def plan_prompt(present: Sequence[bool] | None, prompt_len: int, page_size: int, max_local_tokens: int,
                load_prefix: bool, held: Sequence[int] = (), store_reason: str = "store_off") -> PromptPlan:
    """`present`: per reusable page, in the store (None: the store is off or unusable, then
    `store_reason` says why); `held`: the reusable pages D's own prefix cache holds."""
    held = tuple(sorted(held))
    skip = set(held)
    found = tuple(i for i, ok in enumerate(present or ()) if ok and i not in skip)
    if not found and not held:
        return PromptPlan(PREFILL, store_reason if present is None else "no_prefix")
    left = prompt_len - (len(found) + len(held)) * page_size
    if max_local_tokens <= 0:
        return PromptPlan(PREFILL, "local_off", found if load_prefix else (), held)
    if left > max_local_tokens:
        return PromptPlan(PREFILL, "long_tail", found if load_prefix else (), held)
    return PromptPlan(LOCAL, "short_tail", found, held)
