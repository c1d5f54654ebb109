"""Generated-KV offload keys continue the prompt's hash chain, so the next turn's prompt hits them."""

import pytest

from decode_node.offload import extend_hash_chain, filled_page
from prefill_node.task import reusable_pages
from store_client.page_hash import page_hashes

P = 4


def test_filled_page_positions():
    assert [filled_page(p, P) for p in range(9)] == [None, None, None, 0, None, None, None, 1, None]


def test_chain_of_decoded_pages_equals_hashes_of_the_next_turn_prompt():
    prompt = [5, 6, 7, 8, 9, 10]  # 1 full page + 2 tokens
    generated = [11, 12, 13, 14, 15, 16, 2]  # ends with eos (never fed)
    chain = page_hashes(prompt, P)
    tokens = list(prompt)
    for tok in generated:
        tokens.append(tok)
        pos = len(tokens) - 2  # the token fed in this step is the previous one
        k = filled_page(pos, P)
        if k is not None:
            extend_hash_chain(chain, tokens, k, P)
    # fed positions 0..11 -> pages 0, 1, 2 full (the eos at position 12 was never fed)
    assert len(chain) == 3
    turn2 = prompt + generated + [1, 20, 21, 22]
    assert page_hashes(turn2, P)[:3] == chain
    # a re-tokenized answer differing in one token breaks the chain from that page on
    edited = prompt + [11, 99, 13, 14, 15, 16, 2] + [1, 20, 21, 22]
    assert page_hashes(edited, P)[0] == chain[0] and page_hashes(edited, P)[1] != chain[1]


def test_extend_rejects_gaps_and_partial_pages():
    with pytest.raises(ValueError, match="cannot append page 2"):
        extend_hash_chain([], [1] * 12, 2, P)
    with pytest.raises(ValueError, match="not a full page"):
        extend_hash_chain([], [1, 2], 0, P)


@pytest.mark.parametrize("n,expected", [(1, 0), (4, 0), (5, 1), (8, 1), (9, 2), (40, 9)])
def test_reusable_pages_never_include_the_last_prompt_token(n, expected):
    assert reusable_pages(n, P) == expected
