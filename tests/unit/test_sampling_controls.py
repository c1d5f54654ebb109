"""engine/sampler.py apply_controls: penalties, logit_bias and min_tokens against a hand computation
of vLLM's definitions, and the stop checker's min_tokens."""

from __future__ import annotations

import pytest
import torch

from engine.sampler import Sampler, TokenCounts, TokenHistory, apply_controls
from engine.sampling_params import SamplingParams
from engine.stop import StopChecker

V = 8


def by_hand(logits: list[float], prompt: list[int], output: list[int], p: SamplingParams, stop_ids=()) -> list[float]:
    """vLLM: repetition on prompt + output tokens, then frequency x count and presence over the output,
    then logit_bias, then stop ids to -inf while the output is shorter than min_tokens."""
    x = list(logits)
    for t in set(prompt + output):
        x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
    for t in set(output):
        x[t] -= p.frequency_penalty * output.count(t) + p.presence_penalty
    for t, b in p.logit_bias:
        x[t] += b
    if len(output) < p.min_tokens:
        for t in stop_ids:
            x[t] = float("-inf")
    return x


CASES = [
    SamplingParams(frequency_penalty=0.5),
    SamplingParams(presence_penalty=1.5),
    SamplingParams(presence_penalty=-0.7, frequency_penalty=0.3),
    SamplingParams(repetition_penalty=1.3),
    SamplingParams(repetition_penalty=0.8, frequency_penalty=-0.2),
    SamplingParams(logit_bias={2: 5.0, 7: -100.0}),
    SamplingParams(min_tokens=6, presence_penalty=0.1),
]


@pytest.mark.parametrize("params", CASES)
def test_controls_equal_the_hand_computation(params):
    logits = torch.tensor([[1.5, -0.5, 0.2, 2.0, -1.0, 0.0, 3.0, -2.5],
                           [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]])
    prompt, output = [0, 1, 1], [3, 3, 4, 1]
    history = TokenHistory(prompt + output, len(prompt), stop_ids=(5, 6))
    out = apply_controls(logits, [params, SamplingParams()], [history, None])
    expected = by_hand(logits[0].tolist(), prompt, output, params, (5, 6))
    assert out[0].tolist() == pytest.approx(expected)
    assert torch.equal(out[1], logits[1])  # a row without controls is untouched
    assert not torch.equal(out, logits) and logits[0, 3] == 2.0  # a copy: the caller's logits stay raw


def test_no_control_returns_the_logits_themselves_and_a_missing_history_is_an_error():
    logits = torch.zeros(2, V)
    assert apply_controls(logits, [SamplingParams(), SamplingParams()], None) is logits
    with pytest.raises(ValueError, match="TokenHistory"):
        apply_controls(logits, [SamplingParams(presence_penalty=1.0), SamplingParams()], None)


def test_penalties_change_what_greedy_picks_and_min_tokens_holds_eos_back():
    logits = torch.tensor([[0.0, 5.0, 4.0, 0.0]])
    hist = TokenHistory([1, 1, 1], output_start=0, stop_ids=(2,))
    pick = lambda p: Sampler().sample(logits.clone(), [p], histories=[hist])[0]
    assert pick(SamplingParams(temperature=0)) == 1
    assert pick(SamplingParams(temperature=0, frequency_penalty=0.5)) == 2  # 5 - 3 x 0.5 < 4
    assert pick(SamplingParams(temperature=0, frequency_penalty=0.5, min_tokens=4)) == 1  # 2 is a stop id: -inf
    assert pick(SamplingParams(temperature=0, frequency_penalty=0.5, min_tokens=3)) == 2  # 3 tokens out already


def test_resumed_tokens_count_as_output():
    """After failover the prompt ends with the streamed tokens: output_start leaves them in the output."""
    logits = torch.tensor([[0.0, 5.0, 4.0, 0.0]])
    fresh = TokenHistory([1, 1, 1], output_start=3)  # the three 1s are prompt: no frequency penalty
    resumed = TokenHistory([1, 1, 1], output_start=0)
    p = SamplingParams(temperature=0, frequency_penalty=0.5)
    assert Sampler().sample(logits.clone(), [p], histories=[fresh]) == [1]
    assert Sampler().sample(logits.clone(), [p], histories=[resumed]) == [2]


class _Tok:
    def decode(self, ids, skip_special_tokens=True):
        return "".join("x" if i != 9 else "" for i in ids)


def test_the_stop_checker_ignores_stop_strings_before_min_tokens_but_not_a_stop_token():
    """The sampler masks EOS and stop ids before min_tokens; one it drew anyway was the only token left
    (a grammar that may only end: engine/token_masks.py), and it ends the output."""
    c = StopChecker(_Tok(), SamplingParams(min_tokens=3, stop=("xx",), max_tokens=10), eos_token_ids=(9,))
    assert c.append(1).finish_reason is None and c.append(1).finish_reason is None  # "xx" before 3 tokens
    assert c.append(9).finish_reason == "stop"
    e = StopChecker(_Tok(), SamplingParams(min_tokens=3, max_tokens=10, stop_token_ids=(4,)), eos_token_ids=(9,))
    assert e.append(4).finish_reason == "stop" and e.matched_stop == 4
    s = StopChecker(_Tok(), SamplingParams(min_tokens=2, stop=("xx",), max_tokens=10), eos_token_ids=(9,))
    assert s.append(1).finish_reason is None and s.append(1).finish_reason == "stop"


def test_token_counts_follow_each_history_step_by_step():
    """Rows keeping a TokenCounts give, every step, what counting their whole history gives: while
    they grow, when a row's history is another list (a new request on the same counts), when its
    output start moves, and when two rows pass the same counts (the second is counted, not kept)."""
    gen = torch.Generator().manual_seed(3)
    params = [SamplingParams(repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.2)] * 4
    tokens = [[1, 2, 3], [4, 4], [5, 6, 7, 1], [2]]
    counts = [TokenCounts(), TokenCounts(), None, None]
    counts[3] = counts[0]  # shared by mistake: must not corrupt row 0's
    starts = [1, 1, 2, 0]
    for step in range(8):
        if step == 4:
            tokens[1] = [7, 7, 0, 1, 2, 3, 4, 5]  # another request reusing the counts object, longer than its last
        if step == 6:
            starts[0] = 2
        logits = torch.randn(4, V, generator=gen)
        kept = [TokenHistory(t, s, counts=c) for t, s, c in zip(tokens, starts, counts)]
        fresh = [TokenHistory(list(t), s) for t, s in zip(tokens, starts)]
        assert torch.equal(apply_controls(logits, params, kept), apply_controls(logits, params, fresh)), step
        assert counts[0].length == len(tokens[0]) and counts[1].length == len(tokens[1])
        for t in tokens:
            t.append(int(torch.randint(V, (1,), generator=gen)))


def test_token_counts_count_only_the_new_tokens():
    """The kept counts are not recounted: a token changed in place behind them stays counted as it was
    (histories only grow; this is what makes a step cost its new tokens, not its whole history)."""
    params = [SamplingParams(frequency_penalty=1.0)]
    tokens, c = [0, 3, 3], TokenCounts()
    logits = torch.zeros(1, V)
    apply_controls(logits, params, [TokenHistory(tokens, 0, counts=c)])
    tokens[1] = 5
    tokens.append(6)
    out = apply_controls(logits, params, [TokenHistory(tokens, 0, counts=c)])
    assert out[0, 3] == -2.0 and out[0, 5] == 0.0 and out[0, 6] == -1.0
    assert c.table[1].tolist() == [1, 0, 0, 2, 0, 0, 1, 0]


def test_a_batch_of_penalised_and_bias_only_rows():
    """Only the penalised rows are counted; a logit_bias row beside them gets its bias alone."""
    logits = torch.tensor([[1.5, -0.5, 0.2, 2.0, -1.0, 0.0, 3.0, -2.5]] * 3)
    prompt, output = [0, 1, 1], [3, 3, 4, 1]
    params = [SamplingParams(logit_bias={2: 5.0}), SamplingParams(frequency_penalty=0.5, repetition_penalty=1.3),
              SamplingParams(min_tokens=9, presence_penalty=0.1)]
    counts = [TokenCounts() for _ in params]
    hist = [TokenHistory(prompt + output, len(prompt), stop_ids=(5,), counts=c) for c in counts]
    out = apply_controls(logits, params, hist)
    for i, p in enumerate(params):
        assert out[i].tolist() == pytest.approx(by_hand(logits[i].tolist(), prompt, output, p, (5,)))
    assert counts[0].table is None and counts[1].table is not None  # the bias-only row keeps no counts
