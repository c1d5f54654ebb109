"""A /generate body read the plain way (router/http/plain_generate.py) is what the full way makes of it,
and a body the full way refuses is never served the plain way."""

from __future__ import annotations

import orjson
import pytest

from pdorch.config import Config, DiscoveryConfig, ModelConfig
from router.errors import APIError
from router.http.plain_generate import MAX_KEY_STR, PlainGenerateReader

IDS = list(range(1, 40))


@pytest.fixture(scope="module")
def gen(router_tokenizer, tiny_model_dir):
    """The app's /generate handlers (no worker: only the body's reading is called)."""
    from router.http.app import create_app

    cfg = Config(model=ModelConfig(page_size=16, max_context_tokens=0),
                 discovery=DiscoveryConfig(mode="static", prefill=("127.0.0.1:1",), decode=("127.0.0.1:2",)))
    app = create_app(cfg, router_tokenizer, tiny_model_dir)
    return app.hot_routes.handlers[b"/generate"].__self__


def outcome(gen, body: bytes):
    """What generate_job makes of `body`: every field of the prepared job, or the error's."""
    try:
        ask = gen.generate_job(body, 5.0)
    except APIError as e:
        return ("error", e.status, e.message, e.param)
    s = ask.spec
    return (s.ids, s.sampling.params.SerializeToString(deterministic=True), s.sampling.max_tokens,
            s.sampling.max_tokens_param, s.sampling.top, s.arrived, s.request_id, s.grammar_param, s.session,
            s.default_max_tokens, ask.stream, ask.logprobs, ask.text_in_logprobs, ask.prompt, ask.start)


def _raw(body) -> bytes:
    return body if isinstance(body, bytes) else orjson.dumps(body)


PLAIN = [  # served the plain way once the full way has seen them
    {"input_ids": IDS},
    {"input_ids": IDS, "stream": True, "sampling_params": {"temperature": 0.0, "max_new_tokens": 4}},
    {"input_ids": IDS, "sampling_params": {"temperature": 0}},  # an int where a float belongs (strict allows it)
    {"input_ids": IDS, "rid": "r-1", "sampling_params": {"top_p": 0.9, "top_k": 20, "seed": 7, "n": 2, "stop": "\n",
                                                         "ignore_eos": True, "no_stop_trim": True, "max_new_tokens": None}},
    {"text": "hello there", "sampling_params": {"repetition_penalty": 1.2, "skip_special_tokens": False}},
    {"input_ids": IDS, "model": "anything", "sampling_params": {"min_p": 0.1}},  # a key no field has: ignored
    {"input_ids": [5, -3]},  # refused by the job's checks, which both ways share
    {"input_ids": []},
    b'{"input_ids": [1, 2], "stream": false, "stream": true}',  # a repeated key: the last one, both ways
]
NOT_PLAIN = [  # refused by the full way, never learnt
    {"input_ids": IDS, "sampling_params": {"temperature": False}},
    {"input_ids": IDS, "sampling_params": {"temperature": -1.0}},
    {"input_ids": IDS, "sampling_params": {"top_k": 10**12}},
    {"input_ids": IDS, "sampling_params": {"n": 0}},
    {"input_ids": IDS, "sampling_params": {"structural_tag": "x"}},
    {"input_ids": IDS, "sampling_params": {"seed": None, "temperature": None}},
    {"input_ids": IDS, "text": "both"},
    {"input_ids": [1, True]},
    {"input_ids": IDS, "stream": 1},
    {"input_ids": IDS, "rid": 5},
    b'{"input_ids": [1, 2], "sampling_params": {"temperature": 0.5, "temperature": -2}}',
]
FULL_ONLY = [  # served, but always the full way (a list, a grammar, logprobs, an unknown sampling key)
    {"input_ids": IDS, "sampling_params": {"stop": ["a", "b"]}},
    {"input_ids": IDS, "sampling_params": {"regex": "[ab]+"}},
    {"input_ids": IDS, "return_logprob": True, "top_logprobs_num": 2},
    {"input_ids": IDS, "sampling_params": {"min_new_tokens": 2, "max_new_tokens": 4}},
    {"input_ids": IDS, "sampling_params": {"made_up": 1}},
    {"input_ids": IDS, "sampling_params": {"stop": "x" * (MAX_KEY_STR + 1)}},
]


@pytest.mark.parametrize("body,plain_way", [(b, True) for b in PLAIN] + [(b, False) for b in NOT_PLAIN + FULL_ONLY],
                         ids=lambda b: _raw(b)[:60].decode() if not isinstance(b, bool) else "")
def test_the_plain_way_makes_what_the_full_way_makes(gen, body, plain_way):
    gen.plain = PlainGenerateReader()
    raw = _raw(body)
    first = outcome(gen, raw)  # the full way (the memo is empty)
    again = outcome(gen, raw)
    assert again == first
    plain, _ = gen.plain.read(raw)
    assert (plain is not None) == plain_way, first


@pytest.mark.parametrize("body", [
    {"input_ids": IDS, "sampling_params": {"temperature": 0.5, "max_new_tokens": 9}},
    {"input_ids": [7, 8], "stream": True, "sampling_params": {"temperature": 0.5}},
    {"text": "a prompt", "sampling_params": {"temperature": 0.5, "max_new_tokens": 2047}},
    {"input_ids": IDS, "sampling_params": {"temperature": 0.5, "max_new_tokens": 0}},
    {"input_ids": IDS, "sampling_params": {"temperature": 0.5, "max_new_tokens": 2.0}},
    {"input_ids": IDS, "sampling_params": {"temperature": 0.5, "max_new_tokens": 5000}},
], ids=lambda b: _raw(b)[:60].decode())
def test_a_learnt_sampling_serves_other_prompts_and_lengths_as_the_full_way(gen, body):
    raw = _raw(body)
    gen.plain = PlainGenerateReader()
    alone = outcome(gen, raw)  # the full way: nothing learnt yet
    gen.plain = PlainGenerateReader()
    outcome(gen, _raw({"input_ids": [1], "sampling_params": {"temperature": 0.5, "max_new_tokens": 1}}))
    took_plain = gen.plain.read(raw)[0] is not None
    assert outcome(gen, raw) == alone
    assert took_plain == (alone[0] != "error" or "context" in alone[2])  # a bad max_new_tokens: the full way


def test_a_value_of_another_type_is_another_body(gen):
    gen.plain = PlainGenerateReader()
    assert outcome(gen, _raw({"input_ids": IDS, "sampling_params": {"ignore_eos": True}}))[0] == IDS
    assert outcome(gen, _raw({"input_ids": IDS, "sampling_params": {"ignore_eos": 1}}))[:2] == ("error", 400)
    assert outcome(gen, _raw({"input_ids": IDS, "sampling_params": {"n": 1}}))[0] == IDS
    assert outcome(gen, _raw({"input_ids": IDS, "sampling_params": {"n": True}}))[:2] == ("error", 400)


def test_the_memo_is_bounded(gen):
    gen.plain = PlainGenerateReader(capacity=4)
    for seed in range(10):
        outcome(gen, _raw({"input_ids": IDS, "sampling_params": {"seed": seed}}))
    assert len(gen.plain._memo) <= 4
