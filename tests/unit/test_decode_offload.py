"""Generated-KV offload keys continue the prompt's hash chain, so the next turn's prompt hits them.

The chain test drives the real DecodeScheduler (tiny random-weights model): the keys it writes
must be the store keys of the next turn's prompt pages.
"""

import time

import pytest

from decode_node.offload import extend_hash_chain, filled_page
from pdorch.worker.prompt_pages import reusable_pages
from store_client.page_hash import page_hashes, store_key
from tests.unit.test_decode_scheduler import (
    HeldStoreIO,
    events_until_final,
    load_tiny,
    prefilled,
    start_scheduler,
)

PAGE_SIZE = 4


def test_filled_page_positions():
    assert [filled_page(p, PAGE_SIZE) for p in range(9)] == [None, None, None, 0, None, None, None, 1, None]


@pytest.fixture(scope="module")
def model(tmp_path_factory, tiny_model_dir):
    return load_tiny(tmp_path_factory.mktemp("decode_offload"), tiny_model_dir)


def test_offloaded_pages_are_the_next_turn_prompt_pages(model):
    io = HeldStoreIO()
    sched, _ = start_scheduler(model, 8, store_io=io)
    try:
        prompt = list(range(10, 30))  # 20 tokens: page 0 full, 4 tokens into page 1
        req = prefilled(sched, model[3], "turn1", prompt, max_tokens=40)
        sched.join(req)
        assert events_until_final(req)[-1].finish_reason == "length"
        # answered, but both step writes still read its pages: one lease each, pages not yet back
        assert "step_write:1" in req.io and "step_write:2" in req.io and len(req.io) == 2, req.io
        io.release()
        deadline = time.monotonic() + 10
        while len(req.io) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(req.io) == 0  # each completion gave back exactly its own lease
    finally:
        sched.stop()
    generated = req.token_ids[len(prompt):]
    # fed: positions 0..58 (the last generated token is never fed) -> pages 1 and 2 filled while
    # decoding, one store write per step that filled a page
    turn2 = prompt + generated + [1, 2, 3]
    assert io.saves == [[store_key("fp", h)] for h in page_hashes(turn2, 16)[1:3]]
    assert req.page_hashes == page_hashes(turn2, 16)[:3]
    # an answer re-tokenized differently in one token breaks the chain from that page on
    edited = prompt + [generated[0] + 1] + generated[1:] + [1, 2, 3]
    assert page_hashes(edited, 16)[0] == req.page_hashes[0] and page_hashes(edited, 16)[1] != req.page_hashes[1]


def test_extend_rejects_gaps_and_partial_pages():
    with pytest.raises(ValueError, match="cannot append page 2"):
        extend_hash_chain([], [1] * 12, 2, PAGE_SIZE)
    with pytest.raises(ValueError, match="not a full page"):
        extend_hash_chain([], [1, 2], 0, PAGE_SIZE)


@pytest.mark.parametrize("n,expected", [(1, 0), (4, 0), (5, 1), (8, 1), (9, 2), (40, 9)])
def test_reusable_pages_never_include_the_last_prompt_token(n, expected):
    assert reusable_pages(n, PAGE_SIZE) == expected


def test_pages_a_leader_switch_lost_are_written_again_from_the_prefix_cache(model):
    """The store client's audit hands over generated pages the new leader lacks: the decode worker
    writes again those its prefix cache holds, retained until the write lands; unknown keys are skipped."""
    io = HeldStoreIO()
    sched, rt = start_scheduler(model, 8, store_io=io, prefix_cache=True)
    try:
        req = prefilled(sched, model[3], "turn1", list(range(10, 30)), max_tokens=40)
        sched.join(req)
        assert events_until_final(req)[-1].finish_reason == "length"
        io.release()
        written = [k for keys in io.saves for k in keys]
        assert len(written) == 2  # pages 1 and 2, generated
        deadline = time.monotonic() + 10
        while sched.call(rt.allocator.num_available) != 8 and time.monotonic() < deadline:
            time.sleep(0.01)  # the request's pages go back (cached, evictable) once its writes landed
        free = sched.call(rt.allocator.num_available)
        assert free == 8
        sched.store_lost([written[1], store_key("fp", "not-held")])
        deadline = time.monotonic() + 10
        while len(io.saves) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert io.saves[2] == [written[1]]
        assert sched.call(rt.allocator.num_available) == free - 1  # retained while it is written
        io.release()
        deadline = time.monotonic() + 10
        while sched.call(rt.allocator.num_available) != free and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sched.call(rt.allocator.num_available) == free  # released once it landed
        restored = sched._writes.restore.restored._value.get()
        assert restored == 1
    finally:
        sched.stop()
