"""Sampler and SamplingParams: greedy, temperature, top-k, top-p, seeds, validation."""

import pytest
import torch

from engine.sampler import Sampler, make_generator
from engine.sampling_params import SamplingParams

LOGITS = torch.log(torch.tensor([[0.5, 0.3, 0.2, 1e-9]]))


def draws(params, n=300, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [Sampler().sample(LOGITS, [params], [gen])[0] for _ in range(n)]


def test_greedy_picks_argmax_per_row():
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 2.9]])
    ps = [SamplingParams(temperature=0), SamplingParams(temperature=1.0, top_k=1)]
    assert Sampler().sample(logits, ps) == [1, 0]


def test_top_k_and_top_p_restrict_support():
    assert set(draws(SamplingParams(top_k=2))) == {0, 1}
    assert set(draws(SamplingParams(top_p=0.5))) == {0}
    assert set(draws(SamplingParams(top_p=0.6))) == {0, 1}
    assert set(draws(SamplingParams())) == {0, 1, 2}


def test_temperature_sharpens_and_flattens():
    cold = draws(SamplingParams(temperature=0.2))
    hot = draws(SamplingParams(temperature=5.0))
    assert cold.count(0) > 270 and hot.count(0) < 150


def test_seed_makes_requests_reproducible():
    p = SamplingParams(seed=1234)
    gens = [make_generator(p), make_generator(p)]
    logits = torch.zeros(2, 1000)
    a = [Sampler().sample(logits, [p, p], gens) for _ in range(5)]
    assert all(x == y for x, y in a)          # both rows see the same seed -> same tokens
    again = make_generator(p)
    assert [Sampler().sample(logits[:1], [p], [again])[0] for _ in range(5)] == [x for x, _ in a]
    other = make_generator(SamplingParams(seed=99))
    assert [Sampler().sample(logits[:1], [p], [other])[0] for _ in range(5)] != [x for x, _ in a]
    assert make_generator(SamplingParams()) is None


@pytest.mark.parametrize("kwargs, field", [({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"),
                                            ({"top_k": -2}, "top_k"), ({"max_tokens": 0}, "max_tokens"),
                                            ({"stop": ("",)}, "stop"), ({"seed": 1.5}, "seed")])
def test_bad_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_params_freeze_lists():
    p = SamplingParams(stop=["a", "b"], stop_token_ids=[5])
    assert p.stop == ("a", "b") and p.stop_token_ids == (5,)
    assert SamplingParams(stop="x").stop == ("x",)
    hash(p)
