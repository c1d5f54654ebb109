"""The hit rates a perfect cache would reach on what the replay sent, page-aligned as pdorch caches:
full pages only, and never the page holding a prompt's last token (its logits give the first token).

    instant   a request reuses every leading full page of its prompt that any request sent before it
              had: as if every earlier prompt's KV existed the moment it was sent
    causal    only pages that existed when it was sent: an earlier request's prompt pages once its
              prefill had ended (its first token had arrived), its answer's pages once it had ended;
              from the measured times. Requests that overlap in prefill make causal < instant; that
              gap is what computing a prefix once for all of them (in-flight sharing) can close.

An earlier request's KV is its prompt and its answer but the last token (never fed to the model), so
a turn that carries the previous answer can reuse it (decode offload). Pages are compared by a hash
chained over the page's ids and every page before it, so equal keys mean an equal prefix.
Pure (no I/O, no clock): unit-tested on traces worked out by hand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class IdealInput:
    prompt_ids: list[int]
    answer_ids: list[int]             # what was generated (its last token has no KV)
    sent_s: float
    prompt_ready_s: float | None      # first token arrived: the prompt's KV exists (None: never)
    answer_ready_s: float | None      # the request ended: its answer's KV exists


def page_keys(ids: list[int], page_size: int) -> list[int]:
    keys, h = [], 0
    for start in range(0, len(ids) // page_size * page_size, page_size):
        h = hash((h, tuple(ids[start:start + page_size])))
        keys.append(h)
    return keys


def _leading(keys: list[int], present) -> int:
    n = 0
    while n < len(keys) and present(keys[n]):
        n += 1
    return n


def ideal_tokens(requests: list[IdealInput], page_size: int) -> list[tuple[int, int]]:
    """(instant, causal) reusable tokens of each request, in the order given; "before" is by send
    time, then position (requests sent in the same instant: the earlier position first)."""
    seen: set[int] = set()
    ready: dict[int, float] = {}  # page key -> earliest time it existed
    out: list[tuple[int, int]] = [(0, 0)] * len(requests)
    for i in sorted(range(len(requests)), key=lambda i: (requests[i].sent_s, i)):
        r = requests[i]
        prompt_keys = page_keys(r.prompt_ids, page_size)
        reusable = prompt_keys[:max(0, (len(r.prompt_ids) - 1) // page_size)]
        instant = _leading(reusable, seen.__contains__)
        causal = _leading(reusable, lambda k, at=r.sent_s: ready.get(k, math.inf) <= at)
        out[i] = (instant * page_size, causal * page_size)
        context = r.prompt_ids + r.answer_ids[:-1]
        for j, key in enumerate(page_keys(context, page_size)):
            seen.add(key)
            t = r.prompt_ready_s if j < len(prompt_keys) else r.answer_ready_s
            ready[key] = min(ready.get(key, math.inf), math.inf if t is None else t)
    return out
