"""StopChecker: stop strings (trimmed, never leaked), stop ids, eos, ignore_eos, max_tokens,
incremental detokenization that never emits half a UTF-8 character."""

import pytest

from engine.sampling_params import SamplingParams
from engine.stop import StopChecker
from engine.tokenizer import Tokenizer

EOS = 2


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return Tokenizer.from_dir(tiny_model_dir)


def run(tok, ids, **kw):
    sc = StopChecker(tok, SamplingParams(**kw), eos_token_ids=(EOS,))
    deltas, reason = [], None
    for t in ids:
        out = sc.append(t)
        deltas.append(out.text)
        if out.finish_reason:
            reason = out.finish_reason
            break
    return sc, deltas, reason


def test_max_tokens_gives_length(tok):
    ids = tok.encode("one two three four five")
    sc, deltas, reason = run(tok, ids, max_tokens=3)
    assert reason == "length" and len(sc.ids) == 3
    assert "".join(deltas) == sc.output_text == tok.decode(ids[:3])


def test_eos_stops_without_text_unless_ignored(tok):
    ids = tok.encode("Paris.") + [EOS] + tok.encode(" more")
    sc, deltas, reason = run(tok, ids, max_tokens=50)
    assert reason == "stop" and sc.matched_stop == EOS and "".join(deltas) == "Paris."
    sc, deltas, reason = run(tok, ids, max_tokens=50, ignore_eos=True)
    assert reason is None and "".join(deltas) == "Paris. more"


def test_stop_token_ids(tok):
    ids = tok.encode("a b c d")
    sc, deltas, reason = run(tok, ids, stop_token_ids=(ids[2],))
    assert reason == "stop" and sc.ids == ids[:3] and "".join(deltas) == tok.decode(ids[:2])


def test_stop_string_is_trimmed_and_never_partially_emitted(tok):
    ids = tok.encode("The answer is 42. END of story")
    sc, deltas, reason = run(tok, ids, max_tokens=50, stop=("END", "never"))
    assert reason == "stop" and sc.matched_stop == "END"
    assert "".join(deltas) == sc.output_text == "The answer is 42. "
    assert all("E" not in d for d in deltas)


def test_stop_string_spanning_tokens(tok):
    ids = tok.encode("hello world")
    sc, deltas, reason = run(tok, ids, stop=("o w",))
    assert reason == "stop" and "".join(deltas) == sc.output_text == "hell"


def test_multibyte_characters_are_never_split(tok):
    text = "ok 🎉世界🎉 done"
    ids = tok.encode(text)
    assert len(ids) > len(text.split())  # the emoji really is several byte-level tokens
    sc, deltas, reason = run(tok, ids, max_tokens=100)
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == sc.output_text == text and reason is None
