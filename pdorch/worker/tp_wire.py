"""A tensor-parallel worker's steps as int64 words, sent by rank 0 to its followers over the group's
CPU (gloo) group: what a step needs and nothing more, each page table as a delta from the row of the
previous forward it continues (as SGLang broadcasts step metadata over a CPU group, and vLLM sends
only what changed).

    words    [op, n_chunks | op args...]
    forward  per chunk 5 words: ref, keep, new_pages, start_pos, n_tokens (+ every_row for
             FORWARD_EVERY_ROW), then each chunk's new page ids and token ids, in chunk order

A chunk's page table is `previous forward's chunk ref`'s first `keep` pages + its new ones (ref -1:
all new). In a steady decode batch a row keeps its whole table and sends one token, and a new page
once every page_size steps: 6 words a row, not the pickled table (~100 KB a step at batch 128 x 4k).
The delta is found by content, never assumed: rank 0 keeps a copy of the tables it sent and checks
that the previous table is a prefix of the new one, so a batch that changed (rows finished, joined,
preempted, forked) costs only the pages of its changed rows, and nothing can be stale.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.attention.batch import Chunk

FORWARD, FORWARD_EVERY_ROW, COPY_PAGE, NOOP, STOP, CAPTURE = range(1, 7)
_CHUNK_WORDS = {FORWARD: 5, FORWARD_EVERY_ROW: 6}


@dataclass(frozen=True)
class Step:
    """One decoded step: op, its chunks (forwards), its every_row flags (FORWARD_EVERY_ROW), its
    integer arguments (COPY_PAGE: src, dst; CAPTURE: max_batch, max_context)."""

    op: int
    chunks: tuple[Chunk, ...] = ()
    every_row: tuple[bool, ...] = ()
    args: tuple[int, ...] = ()


class StepEncoder:
    """Rank 0's side: steps to words; remembers the tables of the last forward it encoded."""

    def __init__(self):
        self._prev: list[list[int]] = []       # the last forward's page tables (copies: rows grow in place)
        self._by_last: dict[int, int] = {}     # a table's last page id -> its index in _prev

    def forward(self, chunks: Sequence[Chunk], every_row: Sequence[bool] | None = None) -> list[int]:
        op = FORWARD if every_row is None else FORWARD_EVERY_ROW
        head: list[int] = [op, len(chunks)]
        data: list[int] = []
        tables: list[list[int]] = []
        for i, c in enumerate(chunks):
            table = list(c.page_ids)
            ref, keep = self._continues(table)
            head += (ref, keep, len(table) - keep, c.start_pos, len(c.token_ids))
            if every_row is not None:
                head.append(1 if every_row[i] else 0)
            data += table[keep:]
            data += c.token_ids
            tables.append(table)
        self._prev = tables
        self._by_last = {t[-1]: i for i, t in enumerate(tables) if t}
        return head + data

    def _continues(self, table: list[int]) -> tuple[int, int]:
        """(ref, keep): the previous row whose whole table starts this one (-1, 0: none)."""
        for page in table[-1:] + table[-2:-1]:  # a decode row's last page is its last one, or the one before
            ref = self._by_last.get(page)
            if ref is not None:
                prev = self._prev[ref]
                if len(prev) <= len(table) and table[:len(prev)] == prev:
                    return ref, len(prev)
        return -1, 0

    @staticmethod
    def simple(op: int, *args: int) -> list[int]:
        """A step without chunks: COPY_PAGE, NOOP, STOP, CAPTURE."""
        return [op, *args]


class StepDecoder:
    """A follower's side: words to steps; rebuilds each table from the previous forward's."""

    def __init__(self):
        self._prev: list[list[int]] = []

    def decode(self, words: list[int]) -> Step:
        op = words[0]
        if op not in _CHUNK_WORDS:
            return Step(op, args=tuple(words[1:]))
        n, width = words[1], _CHUNK_WORDS[op]
        at = 2 + n * width
        chunks, flags, tables = [], [], []
        for i in range(n):
            ref, keep, new, start, n_tokens, *flag = words[2 + i * width: 2 + (i + 1) * width]
            table = (self._prev[ref][:keep] if ref >= 0 else []) + list(words[at:at + new])
            at += new
            tokens = list(words[at:at + n_tokens])
            at += n_tokens
            chunks.append(Chunk(table, start, tokens))
            tables.append(table)
            flags += [bool(f) for f in flag]
        if at != len(words):
            raise ValueError(f"TP step of {len(words)} words, {at} read: rank 0 and this rank disagree on the format")
        self._prev = tables
        return Step(op, tuple(chunks), tuple(flags))
