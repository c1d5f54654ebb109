"""engine/token_masks.py through the sampler: allowed_token_ids, bad_words and min_tokens, each only where
it leaves a token (the grammar wins), and no row ever sampled from all -inf logits."""

from __future__ import annotations

import pytest
import torch

from engine.grammar import Grammars
from engine.sampler import Sampler, TokenHistory
from engine.sampling_params import GrammarSpec, SamplingParams
from engine.stop import StopChecker
from engine.tokenizer import Tokenizer

V = 8
EOS = 7


@pytest.fixture(scope="module")
def env(tiny_model_dir):
    tk = Tokenizer.from_dir(tiny_model_dir)
    grammars = Grammars(tiny_model_dir, tk.vocab_size + 64)
    yield tk, grammars
    grammars.close()


def run_worker(tk, grammar, params: SamplingParams, seed: int = 0, prompt=(5, 6)) -> tuple[list[int], str, str]:
    """What a worker does per step: random logits, the sampler with the request's history, the stop
    checker; returns (output ids, text, finish reason)."""
    gen = torch.Generator().manual_seed(seed)
    stop = StopChecker(tk, params, eos_token_ids=tk.eos_token_ids)
    tokens = list(prompt)
    sampler = Sampler()
    while True:
        logits = torch.randn(1, tk.vocab_size + 64, generator=gen) * 4
        history = TokenHistory(tokens, len(prompt), stop_ids=tuple(tk.eos_token_ids))
        (t,) = sampler.sample(logits, [params], None, [grammar], [history])
        tokens.append(t)
        if grammar is not None:
            assert grammar.rejected == 0
        out = stop.append(t)
        if out.finish_reason:
            return tokens[len(prompt):], stop.output_text, out.finish_reason


def test_min_tokens_never_masks_the_only_token_a_grammar_allows(env):
    """regex `ab` with min_tokens=5: after "ab" the grammar allows only EOS; the grammar wins (the
    output ends there) instead of every logit at -inf and token 0 drawn."""
    tk, grammars = env
    for seed in range(3):
        grammar = grammars.start(GrammarSpec("regex", "ab"), [], 30)
        ids, text, finish = run_worker(tk, grammar, SamplingParams(temperature=1.0, min_tokens=5, max_tokens=20), seed)
        assert (text, finish) == ("ab", "stop") and ids[-1] in tk.eos_token_ids and 0 not in ids
        assert grammar.terminated


def test_min_tokens_still_holds_eos_back_where_the_grammar_allows_more(env):
    tk, grammars = env
    grammar = grammars.start(GrammarSpec("regex", "a{1,12}"), [], 30)
    eos = tk.eos_token_ids[0]
    ids, text, finish = run_worker(tk, grammar, SamplingParams(temperature=0, min_tokens=6, max_tokens=20,
                                                               logit_bias={eos: 100.0}))
    assert finish == "stop" and ids[-1] == eos and len(ids) == 7 and set(text) == {"a"}  # EOS wanted from the first


def test_allowed_token_ids_with_a_grammar_intersect_and_the_grammar_wins_when_they_do_not(env):
    tk, grammars = env
    b, c = (tk.encode(x, add_special_tokens=False)[0] for x in ("b", "c"))
    both = grammars.start(GrammarSpec("regex", "[abc]{4}"), [], 30)
    _, text, _ = run_worker(tk, both, SamplingParams(temperature=1.0, allowed_token_ids=(b, c) + tk.eos_token_ids,
                                                     max_tokens=10))
    assert len(text) == 4 and set(text) <= {"b", "c"}
    apart = grammars.start(GrammarSpec("regex", "a{3}"), [], 30)
    _, text, _ = run_worker(tk, apart, SamplingParams(temperature=1.0, allowed_token_ids=(b,), max_tokens=10))
    assert text == "aaa"  # the grammar allows only "a": allowed_token_ids cannot take it away


def sample_many(params: SamplingParams, history: TokenHistory, n: int = 200, logits=None) -> set[int]:
    gen = torch.Generator().manual_seed(1)
    x = torch.zeros(n, V) if logits is None else logits.expand(n, V).clone()
    return set(Sampler().sample(x, [params] * n, [gen] * n, None, [history] * n))


def test_allowed_token_ids_are_the_only_tokens_sampled():
    history = TokenHistory([1, 2], 2, stop_ids=(EOS,))
    assert sample_many(SamplingParams(allowed_token_ids=(2, 5)), history) == {2, 5}
    # out of the logits' range: no effect at all rather than a row with nothing left
    assert sample_many(SamplingParams(allowed_token_ids=(99,)), history) == set(range(V))


def test_bad_words_ban_a_words_last_token_where_the_output_ends_with_the_rest():
    params = SamplingParams(temperature=0, bad_words=((3,), (4, 5)))
    best5 = torch.tensor([[0.0, 0, 0, 9, 0, 8, 0, 0]])  # greedy: 3, then 5

    def pick(tokens, start):
        return Sampler().sample(best5.clone(), [params], None, None, [TokenHistory(tokens, start)])[0]

    assert pick([1, 2], 2) == 5  # 3 is a one-token bad word: always banned
    assert pick([1, 2, 4], 2) == 0  # the output ends with 4: 5 completes "4 5"
    assert pick([1, 4], 2) == 5  # 4 is the prompt's: not output
    assert sample_many(SamplingParams(bad_words=((3,),)), TokenHistory([1], 1)) == set(range(V)) - {3}


def test_masks_yield_in_order_where_nothing_would_be_left():
    """allowed_token_ids = {EOS} under min_tokens: min_tokens would leave nothing, so EOS; a bad word
    that is the only allowed token stays too."""
    history = TokenHistory([1, 2], 2, stop_ids=(EOS,))
    assert sample_many(SamplingParams(allowed_token_ids=(EOS,), min_tokens=4), history) == {EOS}
    assert sample_many(SamplingParams(allowed_token_ids=(3, EOS), min_tokens=4), history) == {3}
    assert sample_many(SamplingParams(allowed_token_ids=(3,), bad_words=((3,),)), history) == {3}


def test_a_resumed_streams_min_tokens_counts_the_streamed_tokens_once():
    """failover after 3 of min_tokens=6 streamed: the router sends min_tokens=3 and resumed_tokens=3;
    EOS stays masked until 6 output tokens in all (not 3 + 3 x 2)."""
    params = SamplingParams(temperature=0, min_tokens=3, resumed_tokens=3)
    eos_best = torch.zeros(1, V)
    eos_best[0, EOS] = 9.0
    for produced, masked in ((0, True), (2, True), (3, False)):
        tokens = [1, 1] + [4, 4, 4] + [4] * produced  # prompt, 3 streamed (in the prompt), `produced` new
        history = TokenHistory(tokens, 2, stop_ids=(EOS,))
        (t,) = Sampler().sample(eos_best.clone(), [params], None, None, [history])
        assert (t != EOS) == masked, produced


@pytest.mark.parametrize("params", [SamplingParams(min_tokens=2), SamplingParams(allowed_token_ids=(1,)),
                                    SamplingParams(temperature=0, min_tokens=2)])
def test_a_row_with_no_finite_logit_is_an_error_not_token_zero(params):
    logits = torch.zeros(2, V)
    logits[1] = float("-inf")
    history = TokenHistory([1], 1, stop_ids=(EOS,))
    with pytest.raises(RuntimeError, match=r"rows \[1\] have no token to sample"):
        Sampler().sample(logits, [params] * 2, None, None, [history] * 2)
    logits[1] = float("nan")
    with pytest.raises(RuntimeError, match="no token to sample"):
        Sampler().sample(logits, [params] * 2, None, None, [history] * 2)
