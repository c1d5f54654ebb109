"""bench/profile's arithmetic on hand-made timings, and its uncached prompts."""

from __future__ import annotations

import argparse

import pytest

from bench.profile.cli import int_list
from bench.profile.points import burst_size, full_batch_window, saturated_tokens_per_s
from bench.profile.profile_file import profile_dict
from bench.profile.stream import UniquePrompts


def test_the_window_is_where_every_stream_decodes():
    # stream a: tokens at 0, 1, 2, 3, 4; stream b starts late (first token at 2) and ends at 6
    a, b = [0.0, 1.0, 2.0, 3.0, 4.0], [2.0, 3.5, 5.0, 6.0]
    w = full_batch_window([a, b])
    assert (w.start, w.end) == (2.0, 4.0)
    # in (2, 4]: a's tokens at 3 and 4 (gaps 1, 1), b's at 3.5 (gap 1.5): 3 tokens in 2 s
    assert w.tokens == 3 and sorted(w.gaps) == [1.0, 1.0, 1.5]
    assert w.tokens_per_s == 1.5
    assert w.itl_p90_s == pytest.approx(1.0 + 0.5 * 0.8)  # p90 of [1, 1, 1.5]: rank 1.8


def test_no_window_when_a_stream_ends_before_the_last_starts():
    assert full_batch_window([[0.0, 1.0], [2.0, 3.0]]) is None
    assert full_batch_window([[0.0], [0.0]]) is None  # single tokens: no gap at all


def test_a_single_stream_is_its_own_window():
    w = full_batch_window([[10.0, 10.5, 11.0, 11.5]])
    assert (w.tokens, w.tokens_per_s, w.itl_p90_s) == (3, 2.0, 0.5)


def test_saturated_rate_counts_every_prompt_until_the_last_first_token():
    assert saturated_tokens_per_s(100.0, [100.5, 101.0, 102.0, 104.0], 512) == 4 * 512 / 4.0


def test_burst_size():
    assert burst_size(128, 8192) == 64 and burst_size(100, 8192) == 82 and burst_size(4096, 8192) == 4


def test_prompts_never_share_a_first_page():
    prompts = UniquePrompts(range(3, 10), frozenset({5}), seed=1)  # 6 ordinary ids: 36 serial numbers
    made = [prompts.next(16) for _ in range(36)]
    assert len({tuple(p[:2]) for p in made}) == 36 and all(len(p) == 16 for p in made)
    assert all(t in {3, 4, 6, 7, 8, 9} for p in made for t in p)
    with pytest.raises(ValueError, match="more than 36 prompts"):
        prompts.next(16)


def test_profile_dict_has_the_agreed_fields_sorted():
    d = profile_dict("m", "cpu", [{"prompt_tokens": 512, "tokens_per_s": 2.0, "ttft_s": 0.2, "extra": 1},
                                  {"prompt_tokens": 128, "tokens_per_s": 1.0, "ttft_s": 0.1}],
                     [{"batch": 4, "context_tokens": 512, "tokens_per_s": 9.0, "itl_s": 0.5},
                      {"batch": 1, "context_tokens": 512, "tokens_per_s": 3.0, "itl_s": 0.3}])
    assert (d["version"], d["model"], d["device"]) == (1, "m", "cpu") and d["created"].endswith("Z")
    assert d["prefill"] == [{"prompt_tokens": 128, "tokens_per_s": 1.0, "ttft_s": 0.1},
                            {"prompt_tokens": 512, "tokens_per_s": 2.0, "ttft_s": 0.2}]
    assert [x["batch"] for x in d["decode"]] == [1, 4]


@pytest.mark.parametrize("text", ["", "a,b", "0,4", "-1"])
def test_bad_lists_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError):
        int_list(text)


def test_lists_are_sorted_and_unique():
    assert int_list("2048, 128,512,128") == [128, 512, 2048]


def test_full_batch_closes_the_streams_once_each_has_its_window_tokens():
    from bench.profile.measure import FullBatch
    from bench.profile.stream import Timed
    full, a, b = FullBatch(2, 2), Timed(sent=0.0), Timed(sent=0.0)
    a.token_times = [1.0, 2.0, 3.0]
    assert not full.stop(a)               # b has no token yet: the batch is not full
    b.token_times = [2.5]
    assert not full.stop(b)               # full from 2.5: a has 1 token after it, b none
    a.token_times.append(4.0)
    assert not full.stop(a)               # a: 3.0 and 4.0 after 2.5, b still none
    b.token_times += [3.2, 3.9]
    assert full.stop(b) and full.stop(a)  # both have 2: every stream closes at its next chunk
