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


def test_include_stop_str_in_output_ends_the_output_after_the_stop_string_and_holds_nothing_back(tok):
    ids = tok.encode("The answer is 42. END of story")
    sc, deltas, reason = run(tok, ids, max_tokens=50, stop=("END", "never"), include_stop_str_in_output=True)
    assert reason == "stop" and sc.matched_stop == "END"
    assert "".join(deltas) == sc.output_text == "The answer is 42. END"
    held = run(tok, ids[:4], max_tokens=50, stop=("END", "never"))[1]
    shown = run(tok, ids[:4], max_tokens=50, stop=("END", "never"), include_stop_str_in_output=True)[1]
    assert "".join(shown) == tok.decode(ids[:4]) and len("".join(held)) < len("".join(shown))  # no hold-back
    sc, deltas, _ = run(tok, tok.encode("hello world"), stop=("o w",), include_stop_str_in_output=True)
    assert "".join(deltas) == sc.output_text == "hello w"  # a stop string across tokens, text after it cut


def test_include_stop_str_in_output_gives_a_stop_tokens_text(tok):
    ids = tok.encode("a b c d")
    sc, deltas, reason = run(tok, ids, stop_token_ids=(ids[2],), include_stop_str_in_output=True)
    assert reason == "stop" and "".join(deltas) == sc.output_text == tok.decode(ids[:3])
    eos_ids = tok.encode("Paris.") + [EOS]
    assert run(tok, eos_ids, include_stop_str_in_output=True)[0].output_text == "Paris."  # special: skipped
    shown = run(tok, eos_ids, include_stop_str_in_output=True, skip_special_tokens=False)[0]
    assert shown.output_text == "Paris.<|im_end|>" and shown.finish_reason == "stop"


def test_skip_special_tokens_false_keeps_special_tokens_in_the_text(tok):
    ids = tok.encode("<|im_start|>assistant\nhi<|im_end|>", add_special_tokens=False)
    assert "".join(run(tok, ids, ignore_eos=True)[1]) == "assistant\nhi"
    assert "".join(run(tok, ids, ignore_eos=True, skip_special_tokens=False)[1]) == \
        "<|im_start|>assistant\nhi<|im_end|>"


class _SpacedTok:
    """A decoder that joins tokens with spaces (a tokenizer without a decoder does): <a> <b> x."""
    def decode(self, ids, skip_special_tokens=True):
        return " ".join({1: "<a>", 2: "<b>", 3: "x"}[i] for i in ids if not (skip_special_tokens and i in (1, 2)))

    def added_token_texts(self):
        return {1: "<a>", 2: "<b>"}


def test_spaces_between_special_tokens_false_writes_adjacent_special_tokens_as_they_are():
    def text(**kw):
        sc = StopChecker(_SpacedTok(), SamplingParams(skip_special_tokens=False, max_tokens=5, **kw))
        return "".join(sc.append(t).text for t in (3, 1, 2, 1, 3))

    assert text() == "x <a> <b> <a> x"
    assert text(spaces_between_special_tokens=False) == "x <a><b><a> x"  # vLLM: only between two special ones
