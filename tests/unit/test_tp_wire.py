"""pdorch/worker/tp_wire.py: a TP step's words decode to exactly the chunks rank 0 sent, whatever the
batch did since the previous step, and a steady decode step sends a few words a row, not its table."""

from __future__ import annotations

import random

from engine.attention.batch import Chunk
from pdorch.worker.tp_wire import (
    CAPTURE,
    COPY_PAGE,
    FORWARD,
    FORWARD_EVERY_ROW,
    NOOP,
    StepDecoder,
    StepEncoder,
)

PAGE = 4


def as_tuples(chunks) -> list[tuple]:
    return [(list(c.page_ids), c.start_pos, list(c.token_ids)) for c in chunks]


class Row:
    """One request as a scheduler holds it: its page list grows IN PLACE (as DecodeRequest.page_ids does)."""

    def __init__(self, pages: list[int], length: int, page_size: int = PAGE):
        self.pages, self.length, self.page_size = pages, length, page_size

    def chunk(self, rng) -> Chunk:
        if self.length % self.page_size == 0:
            self.pages.append(rng.randrange(10_000))
        chunk = Chunk(self.pages, self.length, [rng.randrange(50_000)])  # the very list, not a copy
        self.length += 1
        return chunk


def test_a_batch_that_changes_every_step_decodes_to_the_chunks_sent():
    """40 steps: rows advance (a new page every PAGE steps, the list grown in place), finish, join with
    a shared prefix, get their table replaced (preemption), fork (a copy of a row's table), and a
    prefill chunk joins now and then; every step the follower's chunks equal rank 0's."""
    rng = random.Random(3)
    enc, dec = StepEncoder(), StepDecoder()
    shared = [rng.randrange(10_000) for _ in range(3)]
    rows = [Row(shared + [rng.randrange(10_000)], 3 * PAGE + 1 + i) for i in range(6)]
    for step in range(40):
        event = step % 5
        if event == 1 and rows:
            rows.pop(rng.randrange(len(rows)))                       # finished
        elif event == 2:
            rows.insert(rng.randrange(len(rows) + 1), Row(list(shared), 3 * PAGE))  # joins on the shared prefix
        elif event == 3 and rows:
            victim = rows[rng.randrange(len(rows))]
            victim.pages = [rng.randrange(10_000) for _ in victim.pages]  # preempted, resumed elsewhere
        elif event == 4 and rows:
            parent = rows[rng.randrange(len(rows))]
            rows.append(Row(list(parent.pages), parent.length))      # a fork
        chunks = [r.chunk(rng) for r in rows]
        every_row = None
        if step % 7 == 0:
            chunks.append(Chunk([rng.randrange(10_000) for _ in range(3)], 0, list(range(2 * PAGE + 3))))
            every_row = [i % 2 == 0 for i in range(len(chunks))]
        words = enc.forward(chunks, every_row)
        got = dec.decode(list(words))
        assert got.op == (FORWARD if every_row is None else FORWARD_EVERY_ROW)
        assert as_tuples(got.chunks) == as_tuples(chunks), f"step {step}"
        assert list(got.every_row) == (every_row or [])


def test_a_steady_decode_step_sends_six_words_a_row():
    """Batch 32 at 4k tokens in pages of 16 (256 pages a row): after the first step a row costs its 5
    header words and its token, plus a page when it enters one; the first step sends every table."""
    rng = random.Random(0)
    rows = [Row([rng.randrange(1 << 20) for _ in range(256)], 256 * 16 - 3 + (i % 3), 16) for i in range(32)]
    enc, dec = StepEncoder(), StepDecoder()
    first = enc.forward([r.chunk(rng) for r in rows])
    dec.decode(first)
    assert len(first) > 32 * 256
    for _ in range(5):  # rows cross into a new page during these steps
        new_pages = sum(1 for r in rows if r.length % 16 == 0)
        chunks = [r.chunk(rng) for r in rows]
        words = enc.forward(chunks)
        assert len(words) == 2 + 32 * 6 + new_pages
        assert as_tuples(dec.decode(words).chunks) == as_tuples(chunks)


def test_a_row_whose_table_changed_under_the_same_last_page_is_sent_whole():
    """Only a previous table that is a prefix of the new one is reused: a row whose earlier pages
    changed while its last page stayed is sent with all its pages."""
    enc, dec = StepEncoder(), StepDecoder()
    dec.decode(enc.forward([Chunk([1, 2, 3], 10, [7])]))
    words = enc.forward([Chunk([9, 2, 3], 11, [8])])
    assert as_tuples(dec.decode(words).chunks) == [([9, 2, 3], 11, [8])]
    assert words[2:7] == [-1, 0, 3, 11, 1]


def test_steps_without_chunks_carry_their_arguments():
    dec = StepDecoder()
    assert dec.decode(StepEncoder.simple(COPY_PAGE, 4, 9)).args == (4, 9)
    assert dec.decode(StepEncoder.simple(CAPTURE, 32, 4096)).args == (32, 4096)
    assert dec.decode(StepEncoder.simple(NOOP)).op == NOOP
