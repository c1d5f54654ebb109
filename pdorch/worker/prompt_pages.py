"""Page arithmetic of a prompt, shared by both workers: which pages may come from a cache, and
which token ranges are left to compute once the cached ones are in place.

Only full pages are cached, and never the page holding the last prompt token (its logits must be
computed to sample the first token). A reusable page found in no tier is a hole: it costs only
itself, computed attending to every page before it.

    reusable pages   | 0 cached | 1 hole | 2 cached | tail (last page, partial) |
    compute_ranges       -       page 1      -        tail
"""

from __future__ import annotations

from collections.abc import Sequence


def reusable_pages(prompt_len: int, page_size: int) -> int:
    """How many leading pages may come from a cache.

        prompt_len=40, page_size=16:  |page0 full|page1 full|page2 8/16|  -> 2 (page2 is partial)
        prompt_len=32, page_size=16:  |page0 full|page1 full|           -> 1 (page1 has the last token)
    """
    return (prompt_len - 1) // page_size


def compute_ranges(holes: Sequence[int], prompt_len: int, page_size: int) -> list[list[int]]:
    """Token ranges [start, end) to compute, in order: each hole page (sorted), then the uncached
    tail; consecutive ranges are merged."""
    tail_start = reusable_pages(prompt_len, page_size) * page_size
    return page_ranges(holes, page_size, [[tail_start, prompt_len]])


def page_ranges(pages: Sequence[int], page_size: int, after: Sequence[Sequence[int]] = ()) -> list[list[int]]:
    """Token ranges [start, end) of whole pages (sorted), then the ranges `after`, consecutive
    ranges merged."""
    ranges = [[i * page_size, (i + 1) * page_size] for i in sorted(pages)] + [list(r) for r in after]
    merged: list[list[int]] = []
    for r in ranges:
        if merged and merged[-1][1] == r[0]:
            merged[-1][1] = r[1]
        else:
            merged.append(r)
    return merged


def computed_full_pages(holes: Sequence[int], prompt_len: int, page_size: int) -> list[int]:
    """Full prompt pages a prefill computes (P's, or D's local one): the holes, then the tail's full page(s). The page
    holding the last token is computed too but is full only when the prompt fills it exactly.

        prompt_len=32, page_size=16: reusable [0], tail = page 1 (full)      -> holes + [1]
        prompt_len=40, page_size=16: reusable [0, 1], tail = page 2 (8/16)   -> holes
    """
    return sorted(holes) + list(range(reusable_pages(prompt_len, page_size), prompt_len // page_size))


def take_ranges(todo: Sequence[Sequence[int]], budget: int) -> list[tuple[int, int]]:
    """The leading pieces (start, end) of the ranges `todo` that fit in `budget` tokens, in order
    (the last one clipped); hand each piece's end to `consume` once it is computed."""
    out = []
    for start, end in todo:
        if budget <= 0:
            break
        end = min(end, start + budget)
        out.append((start, end))
        budget -= end - start
    return out


def consume(todo: list[list[int]], end: int) -> None:
    """The first range of `todo` is computed up to `end` (pieces are taken in order)."""
    todo[0][0] = end
    if todo[0][0] == todo[0][1]:
        todo.pop(0)
