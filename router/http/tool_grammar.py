"""Grammars in the model's own formats, as xgrammar structural tags (the workers compile them:
engine/grammar.py; here they are plain JSON, the router imports no xgrammar): tool calls in the
family's call format, and any grammar applied only after the thinking of a reasoning model.

    format       one call (ARGS: the arguments, under the tool's schema)       calls joined by
    hermes       <tool_call>\\n{"name": "f", "arguments": ARGS}\\n</tool_call>     "\\n"
    llama3_json  {"name": "f", "parameters": ARGS}                               "; "
    mistral      {"name": "f", "arguments": ARGS}, all inside [TOOL_CALLS][...]  ", "

    request                           the output
    tool_choice {"function": f}       f's call, nothing else
    tool_choice "required"            one call or more (parallel_tool_calls false: one), nothing else
    "auto", a tool with strict true   free text; a call, once begun (its format's first characters),
                                      follows its tool's schema (a tool without strict: any object)
    "auto" and a structured output    the structured output, or calls as for "required"

A model with no call format (model.tool_call_parser none) writes forced calls as bare JSON under
one schema, vLLM's construction (`named_grammar`, `required_grammar`; read back by
router/http/json_calls.py). The output is otherwise read back by the family's parser (router/http/tool_parsers.py), as free output is.
xgrammar's own built-in tags for these models differ in what we need: they let text follow
forced calls and assume the prompt opened <think>.

Thinking first (`after_thinking`): for a reasoning model whose prompt leaves thinking on, the
grammar is preceded by the think block, free text up to </think>: opened by the template (the
output starts inside it) or optional (the model may open it). The matcher accepts every token,
thinking included, so P's first token, D's continuation and a resumed stream's replayed tokens all
advance it alike (docs/api.md, "Structured outputs").
"""

from __future__ import annotations

import json

from proto.pdorch.v1 import worker_pb2
from router.errors import bad_request
from router.http.reasoning import CLOSE, INSIDE, MAY_OPEN, OPEN

ANY_OBJECT = {"type": "object"}
# what a JSON value may hold between two tokens: a bound, or a random model writes blanks without end
MAX_BLANKS = 1
MISTRAL_OPEN, MISTRAL_CLOSE = "[TOOL_CALLS][", "]"
_JOIN = {"hermes": "\n", "llama3_json": "; ", "mistral": ", "}
_TRIGGER = {"hermes": "<tool_call>", "llama3_json": '{"name": ', "mistral": "[TOOL_CALLS]"}


def _json_format(schema) -> dict:
    return {"type": "json_schema", "json_schema": schema, "max_whitespace_cnt": MAX_BLANKS}


def call_tag(parser: str, name: str, schema) -> dict:
    """One call of `name` in the format, its arguments under `schema`."""
    key = "parameters" if parser == "llama3_json" else "arguments"
    begin = '{"name": ' + json.dumps(name, ensure_ascii=False) + f', "{key}": '
    if parser == "hermes":
        return {"type": "tag", "begin": "<tool_call>\n" + begin, "content": _json_format(schema),
                "end": "}\n</tool_call>"}
    return {"type": "tag", "begin": begin, "content": _json_format(schema), "end": "}"}


def _wrapped(parser: str, calls: dict) -> dict:
    if parser != "mistral":
        return calls
    return {"type": "sequence", "elements": [{"type": "const_string", "value": MISTRAL_OPEN}, calls,
                                             {"type": "const_string", "value": MISTRAL_CLOSE}]}


def calls_format(parser: str, tags: list[dict], one: bool) -> dict:
    """One call or more of `tags` and nothing else (`one`: exactly one)."""
    calls = tags[0] if one and len(tags) == 1 else \
        {"type": "tags_with_separator", "tags": tags, "separator": _JOIN[parser], "at_least_one": True,
         "stop_after_first": one}
    return _wrapped(parser, calls)


def free_text_format(parser: str, tags: list[dict], one: bool) -> dict:
    """Free text in which a call, once begun, follows its tag."""
    if parser == "mistral":
        calls = {"type": "tags_with_separator", "tags": tags, "separator": _JOIN[parser], "at_least_one": True,
                 "stop_after_first": one}
        tags = [{"type": "tag", "begin": MISTRAL_OPEN, "content": calls, "end": MISTRAL_CLOSE}]
        one = True
    return {"type": "triggered_tags", "triggers": [_TRIGGER[parser]], "tags": tags, "stop_after_first": one}


def answer_or_calls(grammar: worker_pb2.Grammar, parser: str, tags: list[dict], one: bool) -> worker_pb2.Grammar:
    """A structured output together with tool_choice "auto": the output it asks for, or calls."""
    return structural_tag({"type": "or", "elements": [grammar_format(grammar), calls_format(parser, tags, one)]})


def grammar_format(grammar: worker_pb2.Grammar) -> dict:
    """A structured output's grammar as a structural tag's format."""
    if grammar.kind == "structural_tag":
        return json.loads(grammar.spec)["format"]
    if grammar.kind == "json_schema":
        return _json_format(json.loads(grammar.spec))
    if grammar.kind == "json_object":
        return _json_format(ANY_OBJECT)
    if grammar.kind == "regex":
        return {"type": "regex", "pattern": grammar.spec}
    return {"type": "grammar", "grammar": grammar.spec}


def structural_tag(fmt: dict) -> worker_pb2.Grammar:
    return worker_pb2.Grammar(kind="structural_tag", spec=json.dumps({"type": "structural_tag", "format": fmt},
                                                                    ensure_ascii=False))


def after_thinking(grammar: worker_pb2.Grammar, start: str) -> worker_pb2.Grammar:
    """`grammar` preceded by the thinking (`start`: router/http/reasoning.py start_of); unchanged
    when the output does not think."""
    if start not in (INSIDE, MAY_OPEN):
        return grammar
    # Qwen3 and DeepSeek-R1 write a blank line after </think>
    think = {"type": "tag", "begin": "" if start == INSIDE else OPEN, "content": {"type": "any_text"},
             "end": [CLOSE + "\n\n", CLOSE + "\n", CLOSE]}
    if start == MAY_OPEN:
        think = {"type": "optional", "content": think}
    return structural_tag({"type": "sequence", "elements": [think, grammar_format(grammar)]})


# ---------------------------------------------------------- a model with no call format: bare JSON
NO_ARGUMENTS = {"type": "object", "properties": {}}


def named_grammar(parameters: dict | None) -> worker_pb2.Grammar:
    return _grammar(parameters or NO_ARGUMENTS)


def required_grammar(tools, exactly_one: bool) -> worker_pb2.Grammar:
    return _grammar(_required_schema(tools, exactly_one))


def _grammar(schema: dict) -> worker_pb2.Grammar:
    if not isinstance(schema, dict):
        raise bad_request("tools: a function's parameters must be a JSON schema (an object)", param="tools")
    return worker_pb2.Grammar(kind="json_schema", spec=json.dumps(schema))


_DEFS_KEYS = ("$defs", "definitions")  # where JSON schemas keep the definitions "#/$defs/X" points at


def _required_schema(tools, exactly_one: bool) -> dict:
    """Every tool's call in one array schema; the tools' definitions hoisted to its root (below)."""
    params, defs = hoisted_definitions([(t.function.name, t.function.parameters or NO_ARGUMENTS) for t in tools])
    call = [{"type": "object", "properties": {"name": {"type": "string", "enum": [t.function.name]},
                                              "parameters": p},
             "required": ["name", "parameters"]} for t, p in zip(tools, params)]
    schema = {"type": "array", "minItems": 1, "items": call[0] if len(call) == 1 else {"anyOf": call}}
    if exactly_one:
        schema["maxItems"] = 1
    return {**schema, **defs}


def hoisted_definitions(schemas: list[tuple[str, dict]]) -> tuple[list[dict], dict]:
    """(each tool's schema without its definitions, the definitions for the combined schema's root).

    A tool's `$ref: "#/$defs/Address"` points at its own root; copied into a combined schema it must
    find `$defs` at the combined root, so the definitions move there (vLLM's get_tool_schema_defs;
    pydantic puts every nested model in `$defs`). One name defined differently by two tools cannot
    be hoisted: 400 naming both."""
    out: list[dict] = []
    defs: dict[str, dict] = {}  # $defs / definitions -> name -> schema
    owner: dict[tuple[str, str], str] = {}  # (key, name) -> the tool that defined it first
    for name, schema in schemas:
        if not isinstance(schema, dict):
            raise bad_request(f"tools: {name}'s parameters must be a JSON schema (an object)", param="tools")
        schema = dict(schema)
        for key in _DEFS_KEYS:
            mine = schema.pop(key, None) or {}
            if not isinstance(mine, dict):
                raise bad_request(f"tools: {name}'s parameters.{key} must be an object", param="tools")
            for def_name, body in mine.items():
                seen = defs.setdefault(key, {})
                if def_name in seen and seen[def_name] != body:
                    raise bad_request(f"tools: {owner[key, def_name]!r} and {name!r} define {key}/{def_name} "
                                      "differently; one request's forced-call grammar holds one definition per name",
                                      param="tools")
                seen[def_name], owner[key, def_name] = body, owner.get((key, def_name), name)
        out.append(schema)
    return out, defs
