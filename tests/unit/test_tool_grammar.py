"""router/http/tool_grammar.py compiled by engine/grammar.py (xgrammar structural tags) with the SmolLM2
tokenizer and random logits: forced calls in each family's format read back by its parser with
arguments that fit their nested (pydantic-style, $defs) schemas; strict tools in "auto"; a
structured output or calls; a reasoning model's thinking before the grammar, across the ways a
matcher is advanced (P's first token then D's, a resumed stream's replayed tokens)."""

from __future__ import annotations

import json

import pytest
import torch

from engine.grammar import Grammars, mask_rows
from engine.sampler import Sampler
from engine.sampling_params import GrammarSpec, SamplingParams
from engine.tokenizer import Tokenizer
from proto.pdorch.v1 import worker_pb2
from router.http.reasoning import INSIDE, MAY_OPEN, split, start_of
from router.http.tool_grammar import after_thinking, answer_or_calls
from router.http.tool_parsers import parse
from router.http.tools import tool_plan
from tests.unit.test_grammar import generate
from tests.unit.test_router_structured import chat, fn

ADDRESS = {"properties": {"city": {"enum": ["Oslo", "Rome"], "title": "City", "type": "string"}},
           "required": ["city"], "title": "Address", "type": "object"}
PERSON = {"$defs": {"Address": ADDRESS},
          "properties": {"name": {"enum": ["Ann", "Bo"], "title": "Name", "type": "string"},
                         "home": {"$ref": "#/$defs/Address"}},
          "required": ["name", "home"], "title": "Person", "type": "object"}
LEVEL = {"properties": {"level": {"enum": [1, 2, 3], "title": "Level", "type": "integer"}}, "required": ["level"],
         "title": "Level", "type": "object"}
TOOLS = [fn("save_person", PERSON), fn("set_level", LEVEL)]
PARSERS = ("hermes", "llama3_json", "mistral")


@pytest.fixture(scope="module")
def env(tiny_model_dir):
    tk = Tokenizer.from_dir(tiny_model_dir)
    grammars = Grammars(tiny_model_dir, tk.vocab_size + 64)
    yield tk, grammars
    grammars.close()


def start(grammars, grammar: worker_pb2.Grammar, generated=()):
    return grammars.start(GrammarSpec(grammar.kind, grammar.spec), list(generated), 30)


def sample_until(tk, grammar, stop: str, seed: int, max_tokens: int = 100) -> list[int]:
    """Tokens sampled under `grammar` from random logits until the text holds `stop` (free text may
    run on after it: "auto")."""
    g, out = torch.Generator().manual_seed(seed), []
    while stop not in tk.decode(out):
        assert len(out) < max_tokens, tk.decode(out)
        out += sample(tk, grammar, g)
    return out


def sample(tk, grammar, g: torch.Generator) -> list[int]:
    """One token under `grammar` from random logits (the grammar accepts it); the sampler's noise from `g`
    too (not the default generator, which the worker's earlier tests moved)."""
    return Sampler().sample(torch.randn(1, tk.vocab_size + 64, generator=g) * 4, [SamplingParams()], [g], [grammar])


def fits(name: str, args: dict) -> bool:
    if name == "set_level":
        return args == {"level": args.get("level")} and args["level"] in (1, 2, 3)
    return set(args) == {"name", "home"} and args["name"] in ("Ann", "Bo") and args["home"] == {
        "city": args["home"].get("city")} and args["home"]["city"] in ("Oslo", "Rome")


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize("seed", [1, 2])
def test_a_forced_call_is_written_in_the_familys_format_and_its_arguments_fit(env, parser, seed):
    tk, grammars = env
    named = tool_plan(chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "save_person"}}), parser)
    text = tk.decode(generate(tk, start(grammars, named.grammar), seed))
    content, (call,) = parse(parser, text, named.names)
    assert content is None and call.name == "save_person" and fits(call.name, json.loads(call.arguments)), text
    required = tool_plan(chat(tools=TOOLS, tool_choice="required"), parser)
    # "required" allows calls after calls: random logits end them only when they happen to pick the EOS
    text = tk.decode(generate(tk, start(grammars, required.grammar), seed, max_tokens=1500))
    content, calls = parse(parser, text, required.names)
    assert content is None and calls and all(fits(c.name, json.loads(c.arguments)) for c in calls), text


@pytest.mark.parametrize("parser", PARSERS)
def test_parallel_tool_calls_false_under_required_ends_after_one_call(env, parser):
    tk, grammars = env
    plan = tool_plan(chat(tools=TOOLS, tool_choice="required", parallel_tool_calls=False), parser)
    for seed in (3, 4):
        _, calls = parse(parser, tk.decode(generate(tk, start(grammars, plan.grammar), seed)), plan.names)
        assert len(calls) == 1 and fits(calls[0].name, json.loads(calls[0].arguments))


def test_a_strict_tool_in_auto_leaves_text_free_and_holds_a_begun_call_to_its_schema(env):
    tk, grammars = env
    strict = fn("set_level", LEVEL)
    strict["function"]["strict"] = True
    plan = tool_plan(chat(tools=[strict]), "hermes")
    prose = tk.encode("Hello there, no tool is needed.", add_special_tokens=False)
    start(grammars, plan.grammar, prose)  # free text follows it
    begun = tk.encode('Sure. <tool_call>\n{"name": "set_level", "arguments": ', add_special_tokens=False)
    text = tk.decode(begun + sample_until(tk, start(grammars, plan.grammar, begun), "</tool_call>", seed=5))
    text = text[:text.index("</tool_call>") + len("</tool_call>")]  # free text may follow: not this test's
    content, (call,) = parse("hermes", text, plan.names)
    assert content == "Sure." and fits("set_level", json.loads(call.arguments)), text
    with pytest.raises(ValueError, match="do not follow"):  # a call of the strict tool off its schema
        start(grammars, plan.grammar, tk.encode('<tool_call>\n{"name": "set_level", "arguments": {"level": 9',
                                                add_special_tokens=False))


def test_a_structured_output_with_auto_tools_allows_the_answer_or_a_call(env):
    tk, grammars = env
    plan = tool_plan(chat(tools=TOOLS), "llama3_json")
    answer = worker_pb2.Grammar(kind="json_schema", spec=json.dumps(LEVEL))
    either = answer_or_calls(answer, plan.parser, list(plan.call_tags), plan.one_call)
    for prefix in ('{"level": 2}', '{"name": "set_level", "parameters": {"level": 1}}'):
        g = start(grammars, either, tk.encode(prefix, add_special_tokens=False))
        g.accept(tk.eos_token_ids[0])
        assert g.terminated, prefix
    with pytest.raises(ValueError, match="do not follow"):
        start(grammars, either, tk.encode("Just text", add_special_tokens=False))


def allowed(tk, grammar) -> set[str]:
    """The first characters of the tokens the grammar allows next."""
    logits = torch.zeros(1, tk.vocab_size + 64)
    mask_rows(logits, [grammar])
    return {tk.decode([i])[:1] for i in torch.isfinite(logits[0]).nonzero().flatten().tolist()}


@pytest.mark.parametrize("kind, spec", [("json_schema", json.dumps(LEVEL)), ("regex", "[0-9]{3}"),
                                        ("forced", "")])
def test_a_reasoning_models_grammar_applies_from_the_end_of_its_thinking(env, kind, spec):
    """The template opened <think>: anything goes until </think>, then the grammar. The thinking is
    replayed as a resumed stream's tokens are; P's first token is accepted by D's matcher after."""
    tk, grammars = env
    if kind == "forced":
        inner = tool_plan(chat(tools=TOOLS, tool_choice="required"), "hermes").grammar
    else:
        inner = worker_pb2.Grammar(kind=kind, spec=spec)
    grammar = after_thinking(inner, INSIDE)
    assert len(allowed(tk, start(grammars, grammar))) > 50  # thinking: free
    thought = tk.encode("Hmm, <tool_call> and {braces} are fine here.\n</think>\n\n", add_special_tokens=False)
    p = start(grammars, grammar, thought)  # P: the thinking so far, then samples the first token
    first = sample(tk, p, torch.Generator().manual_seed(9))
    d = start(grammars, grammar, thought)  # D: advances by P's first token, then continues
    d.accept(first[0])
    text = tk.decode(thought + first + generate(tk, d, seed=10, max_tokens=300))
    reasoning, content = split("qwen3", text, INSIDE)
    assert reasoning == "Hmm, <tool_call> and {braces} are fine here."
    if kind == "json_schema":
        assert json.loads(content)["level"] in (1, 2, 3)
    elif kind == "regex":
        assert content.isdigit() and len(content) == 3
    else:
        _, calls = parse("hermes", content, ("save_person", "set_level"))
        assert calls and all(fits(c.name, json.loads(c.arguments)) for c in calls)


def test_a_model_that_may_open_its_thinking_may_also_answer_at_once(env):
    tk, grammars = env
    grammar = after_thinking(worker_pb2.Grammar(kind="json_schema", spec=json.dumps(LEVEL)), MAY_OPEN)
    first = allowed(tk, start(grammars, grammar))
    assert "<" in first and "{" in first and "H" not in first
    thought = tk.encode("<think>\nok\n</think>\n\n", add_special_tokens=False)
    text = tk.decode(thought + generate(tk, start(grammars, grammar, thought), seed=11))
    assert json.loads(split("qwen3", text, start_of("qwen3", ""))[1])["level"] in (1, 2, 3)
