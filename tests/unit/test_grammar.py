"""engine/grammar.py: xgrammar masks on the sampler's rows, with the SmolLM2 tokenizer and random logits
(the grammar alone decides what is valid: random logits are the harshest model)."""

from __future__ import annotations

import json
import re
import threading

import pytest
import torch

from engine.grammar import GrammarError, Grammars
from engine.sampler import Sampler
from engine.sampling_params import GrammarSpec, SamplingParams
from engine.tokenizer import Tokenizer

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "color": {"enum": ["red", "green"]}},
          "required": ["ok", "color"], "additionalProperties": False}


@pytest.fixture(scope="module")
def env(tiny_model_dir):
    tk = Tokenizer.from_dir(tiny_model_dir)
    grammars = Grammars(tiny_model_dir, tk.vocab_size + 64)  # logits wider than the tokenizer, as models pad
    yield tk, grammars
    grammars.close()


def generate(tk, grammar, seed: int, max_tokens: int = 200, temperature: float = 1.0, prefix=()) -> list[int]:
    """Sample under `grammar` from random logits until an EOS (or max_tokens)."""
    # NOTE: the sampler's noise from its own seeded generator too: from the default one, the tokens would
    # depend on what the worker's earlier tests drew (a run where a forced call never ended)
    g = torch.Generator().manual_seed(seed)
    sampler, params = Sampler(), SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed)
    noise = sampler.make_generator(params)
    out = list(prefix)
    for _ in range(max_tokens):
        logits = torch.randn(1, tk.vocab_size + 64, generator=g) * 4
        (t,) = sampler.sample(logits, [params], [noise], [grammar])
        if t in tk.eos_token_ids:
            return out
        out.append(t)
    raise AssertionError(f"no EOS within {max_tokens} tokens: {tk.decode(out)!r}")


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_json_schema_output_parses_and_fits_the_schema(env, seed):
    tk, grammars = env
    grammar = grammars.start(GrammarSpec("json_schema", json.dumps(SCHEMA)), [], 30)
    value = json.loads(tk.decode(generate(tk, grammar, seed)))
    assert set(value) == {"ok", "color"} and isinstance(value["ok"], bool) and value["color"] in ("red", "green")
    assert grammar.terminated and grammar.rejected == 0


def test_a_required_call_over_nested_pydantic_models_compiles_and_its_output_fits(env):
    """The combined schema of tool_choice "required" with $defs hoisted (router/http/tools.py): every $ref
    resolves, and an output under it names a listed tool with arguments of the nested shape."""
    from router.http.tools import tool_plan
    from tests.unit.test_router_structured import ADDRESS, ORDER, PERSON, chat, fn

    tk, grammars = env
    person = {**PERSON, "properties": {**PERSON["properties"], "name": {"enum": ["Ann", "Bo"]}}}
    address = {**ADDRESS, "properties": {"city": {"enum": ["Oslo", "Rome"]}}}
    person["$defs"] = {"Address": address}
    order = {**ORDER, "$defs": {**ORDER["$defs"], "Address": address},
             "properties": {**ORDER["properties"], "items": {"items": {"$ref": "#/$defs/Item"}, "maxItems": 1}}}
    order["$defs"]["Item"] = {"properties": {"sku": {"enum": ["a1"]}}, "required": ["sku"], "type": "object"}
    person["properties"]["past"] = {"items": {"$ref": "#/$defs/Address"}, "maxItems": 1, "type": "array"}
    plan = tool_plan(chat(tools=[fn("save_person", person), fn("place_order", order)], tool_choice="required",
                          parallel_tool_calls=False))
    grammar = grammars.start(GrammarSpec("json_schema", plan.grammar.spec), [], 30)
    (call,) = json.loads(tk.decode(generate(tk, grammar, seed=3, max_tokens=300)))
    args = call["parameters"]
    home = args["home"] if call["name"] == "save_person" else args["ship_to"]
    assert call["name"] in ("save_person", "place_order") and home["city"] in ("Oslo", "Rome")


def test_regex_and_ebnf_outputs_match(env):
    tk, grammars = env
    text = tk.decode(generate(tk, grammars.start(GrammarSpec("regex", r"[a-c]{3}-\d{2}"), [], 30), seed=5))
    assert re.fullmatch(r"[a-c]{3}-\d{2}", text), text
    ebnf = 'root ::= "yes" | "no" | "maybe"'
    assert tk.decode(generate(tk, grammars.start(GrammarSpec("ebnf", ebnf), [], 30), seed=6)) in ("yes", "no", "maybe")


def test_json_object_takes_any_object_and_nothing_else(env):
    """Random logits never close a free string, so: the tokens of a given text, accepted or not."""
    tk, grammars = env

    def follows(text: str) -> bool:
        ids = tk.encode(text, add_special_tokens=False)
        try:
            g = grammars.start(GrammarSpec("json_object"), ids, 30)
        except GrammarError:
            return False
        g.accept(tk.eos_token_ids[0])
        return g.terminated

    assert follows('{"name": "Ada", "tags": ["x", 1, null], "n": {"deep": true}}')
    assert follows("{}")
    assert not follows("[1, 2]") and not follows('"text"') and not follows('{"a": 1')


def test_a_resumed_stream_continues_the_grammar_from_the_tokens_already_generated(env):
    """failover: the new worker's prompt ends with the k tokens already streamed (resumed_tokens=k)."""
    tk, grammars = env
    spec = GrammarSpec("json_schema", json.dumps(SCHEMA))
    whole = generate(tk, grammars.start(spec, [], 30), seed=7)
    k = len(whole) // 2
    resumed = grammars.start(spec, whole[:k], 30)
    rest = generate(tk, resumed, seed=8)
    value = json.loads(tk.decode(whole[:k] + rest))
    assert set(value) == {"ok", "color"}
    with pytest.raises(GrammarError, match="do not follow"):  # tokens that never fit the grammar
        grammars.start(spec, tk.encode("hello world"), 30)


def test_only_constrained_rows_are_masked(env):
    tk, grammars = env
    grammar = grammars.start(GrammarSpec("regex", "7+"), [], 30)
    logits = torch.randn(3, tk.vocab_size + 64, generator=torch.Generator().manual_seed(0))
    free = logits.clone()
    tokens = Sampler().sample(logits, [SamplingParams(temperature=0.0)] * 3, None, [None, grammar, None])
    assert tokens[0] == int(free[0].argmax()) and tokens[2] == int(free[2].argmax())
    assert torch.equal(logits[0], free[0]) and torch.equal(logits[2], free[2])
    assert set(tk.decode([tokens[1]])) == {"7"}
    allowed = torch.isfinite(logits[1])
    assert 0 < int(allowed.sum()) < 100 and not allowed[tk.vocab_size:].any()  # padding ids never allowed


@pytest.mark.parametrize("spec, words", [
    (GrammarSpec("json_schema", "{not json"), "json_schema is not valid JSON"),
    (GrammarSpec("json_schema", "[1, 2]"), "json_schema must be a JSON object"),
    (GrammarSpec("regex", "a(b"), "invalid regex: Regex parsing error at position 4"),
    (GrammarSpec("ebnf", 'root ::= "a" | '), "invalid ebnf: EBNF parser error"),
])
def test_an_invalid_grammar_names_what_is_wrong_without_cpp_noise(env, spec, words):
    with pytest.raises(GrammarError) as e:
        env[1].start(spec, [], 30)
    assert words in str(e.value) and ".cc:" not in str(e.value)


def test_compiles_run_on_the_compile_thread_and_close_stops_it(tiny_model_dir):
    def compile_threads() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name.startswith("grammar-compile")}

    before = compile_threads()
    grammars = Grammars(tiny_model_dir, 49152)
    grammars.start(GrammarSpec("regex", "a+"), [], 30)
    assert len(compile_threads() - before) == 1
    grammars.close()
    assert compile_threads() == before
    with pytest.raises(RuntimeError, match="closed"):
        grammars.start(GrammarSpec("regex", "a+"), [], 30)


def test_logprobs_are_the_log_softmax_of_the_masked_logits_and_greedy_picks_the_best(env):
    """Sampler.logprobs against a hand computation: log p_i = x_i - log(sum_j exp x_j)."""
    import math

    tk, grammars = env
    grammar = grammars.start(GrammarSpec("regex", "7+"), [], 30)
    logits = torch.randn(3, tk.vocab_size + 64, generator=torch.Generator().manual_seed(3))
    raw = logits.clone()
    params = [SamplingParams(temperature=0.0, logprobs=3), SamplingParams(temperature=0.0),
              SamplingParams(temperature=0.7, logprobs=0)]
    tokens = Sampler().sample(logits, params, None, [grammar, None, None])
    lps = Sampler.logprobs(logits, tokens, params)
    assert lps[1] is None and lps[2].top == ()
    row = raw[2].double().tolist()
    norm = math.log(sum(math.exp(x) for x in row))
    assert abs(lps[2].logprob - (row[tokens[2]] - norm)) < 1e-4
    allowed = [i for i in range(raw.shape[1]) if set(tk.decode([i])) == {"7"}]
    masked = [raw[0, i].item() for i in allowed]
    norm0 = math.log(sum(math.exp(x) for x in masked))  # the grammar's mask is part of the distribution
    best = sorted(zip(masked, allowed), reverse=True)[:3]
    assert [i for i, _ in lps[0].top] == [i for _, i in best]
    assert all(abs(v - (x - norm0)) < 1e-4 for (_, v), (x, _) in zip(lps[0].top, best))
    assert lps[0].logprob == lps[0].top[0][1] and tokens[0] == lps[0].top[0][0]  # greedy: the best
    assert all(v <= 0 for _, v in lps[0].top)
