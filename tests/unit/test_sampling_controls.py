"""engine/sampler.py apply_controls: penalties, logit_bias and min_tokens against a hand computation
of vLLM's definitions, and the stop checker's min_tokens."""

from __future__ import annotations

import pytest
import torch

from engine.sampler import Sampler, TokenHistory, apply_controls
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


def test_the_stop_checker_ignores_eos_stop_ids_and_stop_strings_before_min_tokens():
    c = StopChecker(_Tok(), SamplingParams(min_tokens=3, stop=("xx",), max_tokens=10), eos_token_ids=(9,))
    assert c.append(9).finish_reason is None and c.append(1).finish_reason is None  # eos, "xx" before 3 tokens
    assert c.append(9).finish_reason == "stop"  # the third token: eos ends it
    s = StopChecker(_Tok(), SamplingParams(min_tokens=2, stop=("xx",), max_tokens=10), eos_token_ids=(9,))
    assert s.append(1).finish_reason is None and s.append(1).finish_reason == "stop"
