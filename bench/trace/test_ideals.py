"""bench/trace/ideals.py: the instant and the causal ideal on requests worked out by hand (page size 4).

    A  prompt 1..8 (2 pages)                  sent 0.0  first token 1.0  end 2.0  answer 50..54
       its KV: prompt + answer but the last token = 8 + 4 = 12 tokens = pages P0 P1 P2(50..53)
    B  1..8, 9..12, 13        (13 tokens)     sent 0.5: A still in prefill
    C  1..8, 50, 51, 99, 98, 7                sent 3.0
    D  1..8, 50..53, 54, 60   (14 tokens)     sent 1.5: A's prompt ready, its answer not yet
    E  1..8                   (8 tokens)      sent 5.0: its second page holds its last token
"""

from __future__ import annotations

from bench.trace.ideals import IdealInput, ideal_tokens, page_keys

PAGE = 4
P = list(range(1, 9))


def req(prompt, sent, first=None, end=None, answer=()):
    return IdealInput(prompt_ids=list(prompt), answer_ids=list(answer), sent_s=sent, prompt_ready_s=first,
                      answer_ready_s=end)


def test_instant_and_causal_by_hand():
    a = req(P, 0.0, 1.0, 2.0, answer=[50, 51, 52, 53, 54])
    b = req(P + [9, 10, 11, 12, 13], 0.5, 0.9, 1.0)
    c = req(P + [50, 51, 99, 98, 7], 3.0, 3.1, 3.2)
    d = req(P + [50, 51, 52, 53, 54, 60], 1.5, 1.6, 1.7)
    e = req(P, 5.0, 5.1, 5.2)
    # given out of send order: the answer comes back in the order given
    out = ideal_tokens([c, a, e, d, b], PAGE)
    # C: 13 tokens, 3 reusable pages (the 4th holds its last token); A's P0 P1 match, its page
    #    [50, 51, 99, 98] differs from A's P2 [50..53]: instant 8; A's prompt ready at 1.0 <= 3.0: causal 8
    # A: the first: 0, 0
    # E: 8 tokens, only its first page reusable (the second holds token 8): 4, 4
    # D: 14 tokens, 3 reusable pages: P0 P1 and A's answer page P2 -> instant 12; at 1.5 A's prompt
    #    pages exist (1.0) but its answer page only at its end (2.0) -> causal 8
    # B: 13 tokens, 3 reusable; A's P0 P1 (page [9..12] is nobody's) -> instant 8; at 0.5 nothing
    #    exists yet (A's first token at 1.0) -> causal 0
    assert out == [(8, 8), (0, 0), (4, 4), (12, 8), (8, 0)]


def test_same_instant_earlier_position_counts_for_instant_only():
    first = req(list(range(200, 208)) + [1], 6.0, 6.5, 6.6)
    second = req(list(range(200, 208)) + [2], 6.0, 6.7, 6.8)
    # second: 9 tokens, 2 reusable pages, both first's -> instant 8; first's KV exists from 6.5 -> causal 0
    assert ideal_tokens([first, second], PAGE) == [(0, 0), (8, 0)]


def test_a_failed_request_counts_for_instant_not_causal():
    failed = req(list(range(300, 308)) + [1], 7.0, None, None)
    later = req(list(range(300, 308)) + [2], 9.0, 9.1, 9.2)
    assert ideal_tokens([failed, later], PAGE) == [(0, 0), (8, 0)]


def test_page_keys_chain_the_prefix():
    # equal pages after different prefixes are different keys; a partial page has no key
    assert len(page_keys([1, 2, 3, 4, 5, 6, 7, 8, 9], PAGE)) == 2
    assert page_keys([1, 2, 3, 4, 5, 6, 7, 8], PAGE)[1] != page_keys([0, 0, 0, 0, 5, 6, 7, 8], PAGE)[1]
    assert page_keys([1, 2, 3, 4, 5, 6, 7, 8], PAGE) == page_keys([1, 2, 3, 4, 5, 6, 7, 8, 9], PAGE)
