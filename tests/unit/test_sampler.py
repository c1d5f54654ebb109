"""Sampler and SamplingParams: greedy, temperature, top-k, top-p, seeds, validation."""

import pytest
import torch

from engine.sampler import SampledRows, Sampler, make_generator
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
                                            ({"top_k": -2}, "top_k"), ({"min_p": 1.5}, "min_p"), ({"max_tokens": 0}, "max_tokens"),
                                            ({"stop": ("",)}, "stop"), ({"seed": 1.5}, "seed")])
def test_bad_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_params_freeze_lists():
    p = SamplingParams(stop=["a", "b"], stop_token_ids=[5])
    assert p.stop == ("a", "b") and p.stop_token_ids == (5,)
    assert SamplingParams(stop="x").stop == ("x",)
    hash(p)


def frequencies(logits, params, n, seed=0):
    """Token frequencies of n rows sampled in ONE batched call (n copies of the row)."""
    torch.manual_seed(seed)
    tokens = Sampler().sample(logits.expand(n, -1), [params] * n)
    return torch.bincount(torch.tensor(tokens), minlength=logits.shape[1]).double() / n


def expected(probs, keep):
    p = torch.where(keep, probs, torch.zeros_like(probs))
    return p / p.sum()


PROBS = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.06, 0.04], dtype=torch.float64)


@pytest.mark.parametrize("params, keep", [
    (SamplingParams(), [1, 1, 1, 1, 1, 1]),
    (SamplingParams(top_k=3), [1, 1, 1, 0, 0, 0]),
    (SamplingParams(top_p=0.7), [1, 1, 1, 0, 0, 0]),        # 0.4 + 0.25 < 0.7 <= 0.8
    (SamplingParams(min_p=0.3), [1, 1, 1, 0, 0, 0]),        # below 0.3 x 0.4 = 0.12 dropped
    (SamplingParams(top_k=4, top_p=0.9, min_p=0.2), [1, 1, 1, 1, 0, 0]),
])
def test_batched_distribution_matches_the_masked_probabilities(params, keep):
    """20k rows drawn in one call: each frequency within 4 sigma of the renormalised probability."""
    n = 20_000
    want = expected(PROBS, torch.tensor(keep, dtype=torch.bool))
    got = frequencies(torch.log(PROBS).float()[None], params, n)
    sigma = (want * (1 - want) / n).sqrt()
    assert torch.all((got - want).abs() <= 4 * sigma + 1e-9), (got, want)


def test_temperature_is_applied_per_row():
    logits = torch.log(PROBS).float()[None]
    n = 20_000
    got = frequencies(logits, SamplingParams(temperature=0.5), n)
    want = PROBS ** 2 / (PROBS ** 2).sum()  # p^(1/T), renormalised
    assert torch.all((got - want).abs() <= 4 * (want * (1 - want) / n).sqrt() + 1e-9)


def test_rows_with_different_params_in_one_batch():
    logits = torch.log(PROBS).float()[None].expand(4, -1)
    ps = [SamplingParams(temperature=0), SamplingParams(top_k=1, temperature=2.0), SamplingParams(top_k=2),
          SamplingParams(min_p=0.9)]
    for _ in range(50):
        a, b, c, d = Sampler().sample(logits, ps)
        assert a == 0 and b == 0 and c in (0, 1) and d == 0


def test_seeded_row_is_reproducible_whatever_shares_its_batch():
    """The same seeded request alone, next to greedy rows, and next to other seeded and unseeded rows."""
    vocab = 1000
    torch.manual_seed(0)
    logits = torch.randn(8, vocab)
    me = SamplingParams(seed=42, top_p=0.95, top_k=200)

    def run(rows):  # rows: [(params, seeded?)]; my row is row 0, same logits row each time
        sampler = Sampler()
        gens = [sampler.make_generator(p) for p in rows]
        out = []
        for step in range(6):
            out.append(sampler.sample(logits[:len(rows)], rows, gens)[0])
        return out

    alone = run([me])
    assert run([me, SamplingParams(temperature=0), SamplingParams(temperature=0)]) == alone
    assert run([me, SamplingParams(seed=7), SamplingParams(), SamplingParams(temperature=0.3)]) == alone
    assert run([me] + [SamplingParams()] * 7) == alone
    assert run([SamplingParams(seed=43, top_p=0.95, top_k=200)]) != alone


def test_generator_on_another_device_is_refused():
    class Meta:  # a generator of another device, as a CPU generator is for CUDA logits
        device = torch.device("meta")

    with pytest.raises(ValueError, match="make_generator"):
        Sampler().sample(torch.zeros(1, 4), [SamplingParams(seed=1)], [Meta()])


def test_sampler_makes_generators_on_its_device():
    s = Sampler("cpu")
    assert s.make_generator(SamplingParams(seed=3)).device == s.device
    assert s.make_generator(SamplingParams()) is None


def test_one_host_sync_per_batch(monkeypatch):
    """The whole batch reaches the host once: a single .tolist(), no per-row int() / .item()."""
    calls = []
    real_tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: calls.append("tolist") or real_tolist(self))
    monkeypatch.setattr(torch.Tensor, "item", lambda self: calls.append("item"))
    monkeypatch.setattr(torch.Tensor, "__int__", lambda self: calls.append("int") or 0)
    ps = [SamplingParams(temperature=0), SamplingParams(seed=1, top_p=0.9), SamplingParams(top_k=5, min_p=0.1)]
    s = Sampler()
    out = s.sample(torch.randn(3, 50), ps, [s.make_generator(p) for p in ps])
    assert calls == ["tolist"] and len(out) == 3


def test_a_steady_batch_copies_its_parameters_to_the_device_once(monkeypatch):
    """The sampled rows' parameters are built (and copied) when the batch's parameters change, not every
    step: a decode batch that keeps its requests samples with no host-to-device copy."""
    builds = []
    real = SampledRows.build
    monkeypatch.setattr(SampledRows, "build", staticmethod(lambda *a: builds.append(1) or real(*a)))
    s = Sampler()
    ps = [SamplingParams(temperature=0), SamplingParams(top_k=5, top_p=0.9), SamplingParams(seed=1, min_p=0.1)]
    gens = [s.make_generator(p) for p in ps]
    for _ in range(5):
        out = s.sample(torch.randn(3, 50), ps, gens)
        assert len(out) == 3 and all(0 <= t < 50 for t in out)
    assert len(builds) == 1
    s.sample(torch.randn(2, 50), ps[1:], gens[1:])  # a request left: new rows, rebuilt once
    s.sample(torch.randn(2, 50), list(ps[1:]), gens[1:])
    assert len(builds) == 2


def test_a_seeded_row_given_no_generator_still_samples_within_its_support():
    """A caller that passes no generator for a seeded row gets the default generator's draw there (as
    an unseeded row), never uninitialised noise."""
    logits = torch.log(PROBS).float()[None].expand(3, -1)
    ps = [SamplingParams(seed=3, top_k=2), SamplingParams(top_k=1), SamplingParams(seed=4, top_k=2)]
    s = Sampler()
    for _ in range(30):
        a, b, c = s.sample(logits, ps, [None, None, s.make_generator(ps[2])])
        assert a in (0, 1) and b == 0 and c in (0, 1)


def test_logprob_ranks_count_the_more_likely_tokens():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0], [5.0, 1.0, 1.0, 0.0]])
    lps = Sampler.logprobs(logits, [2, 0], [SamplingParams(logprobs=1)] * 2, ranks=True)
    assert [lp.rank for lp in lps] == [3, 1] and lps[0].top[0][0] == 1
    assert Sampler.logprobs(logits, [2, 0], [SamplingParams(logprobs=1)] * 2)[0].rank is None
