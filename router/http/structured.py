"""Structured outputs: the one grammar a request asks for, from any of the spellings clients send.

    OpenAI    response_format {"type": "json_schema", "json_schema": {"schema": ...}} | {"type": "json_object"}
    vLLM      structured_outputs {"json" | "regex" | "choice" | "grammar" | "json_object"},
              guided_json, guided_regex, guided_choice, guided_grammar (its older names)
    SGLang    json_schema, regex, ebnf (in sampling_params for /generate, top-level in OpenAI bodies)

-> (worker_pb2.Grammar, the field it came from) or None. Only the shape is checked here: the
workers compile it (engine/grammar.py) and refuse an invalid one, which the router answers 400
naming this field (router/dispatch/dispatch.py). NOTE: the router does not import xgrammar (torch and
transformers with it: ~2 s and hundreds of MB in every router replica).
"""

from __future__ import annotations

import json
import re

from proto.pdorch.v1 import worker_pb2
from router.errors import bad_request

MAX_GRAMMAR_BYTES = 1 << 20  # a schema or grammar larger than this is refused (it is compiled on every worker)


def _json_text(value, param: str) -> str:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise bad_request(f"{param} is not valid JSON: {e}", param=param) from None
    if not isinstance(value, dict):
        raise bad_request(f"{param} must be a JSON schema (an object), got {type(value).__name__}", param=param)
    return json.dumps(value)


def choice_regex(choices: list[str], param: str) -> str:
    if not choices:
        raise bad_request(f"{param} must list at least one choice", param=param)
    return "(" + "|".join(re.escape(c) for c in choices) + ")"


_SO_KEYS = {"json_": "json_schema", "regex": "regex", "choice": "choice", "grammar": "ebnf", "json_object": "json_object"}
_TOP_LEVEL = (("guided_json", "json_schema"), ("json_schema", "json_schema"), ("guided_regex", "regex"),
              ("regex", "regex"), ("guided_choice", "choice"), ("guided_grammar", "ebnf"), ("ebnf", "ebnf"))
# every body field _fields reads (all default to None)
GRAMMAR_FIELDS = frozenset(("response_format", "structured_outputs", *(name for name, _ in _TOP_LEVEL)))


def _fields(req) -> list[tuple[str, str, object]]:
    """(param, what it asks for, value) of every grammar field the body sets."""
    out: list[tuple[str, str, object]] = []
    rf = getattr(req, "response_format", None)
    if rf is not None and rf.type == "json_object":
        out.append(("response_format", "json_object", ""))
    elif rf is not None and rf.type == "json_schema":
        if rf.json_schema is None or rf.json_schema.schema_ is None:
            raise bad_request("response_format.json_schema.schema is required with type json_schema",
                              param="response_format.json_schema.schema")
        out.append(("response_format.json_schema.schema", "json_schema", rf.json_schema.schema_))
    so = getattr(req, "structured_outputs", None)
    if so is not None:
        keys = [k for k in _SO_KEYS if getattr(so, k) not in (None, False)]
        if len(keys) != 1:
            raise bad_request("structured_outputs must set exactly one of json, regex, choice, grammar, json_object",
                              param="structured_outputs")
        out.append(("structured_outputs." + keys[0].rstrip("_"), _SO_KEYS[keys[0]], getattr(so, keys[0])))
    out += [(name, what, getattr(req, name)) for name, what in _TOP_LEVEL if getattr(req, name, None) is not None]
    return out


def _spec(what: str, value, param: str) -> tuple[str, str]:
    """(grammar kind, spec text) as the workers compile it."""
    if what == "json_schema":
        return what, _json_text(value, param)
    if what == "choice":
        return "regex", choice_regex(value, param)
    if what == "json_object":
        return what, ""
    return what, value


def grammar_of(req, prefix: str = "") -> tuple[worker_pb2.Grammar, str] | None:
    """The request's grammar and the field it came from; None without one. `prefix`: where the
    fields sit in the body ("sampling_params." for /generate)."""
    if req.model_fields_set.isdisjoint(GRAMMAR_FIELDS):  # NOTE: most bodies set none: no attribute read
        return None
    found = _fields(req)
    if not found:
        return None
    if len(found) > 1:
        names = ", ".join(prefix + p for p, _, _ in found)
        raise bad_request(f"at most one structured output per request; this one sets {names}", param=prefix + found[1][0])
    param, what, value = found[0]
    kind, spec = _spec(what, value, prefix + param)
    if not spec and kind != "json_object":
        raise bad_request(f"{prefix}{param} is empty", param=prefix + param)
    if len(spec.encode()) > MAX_GRAMMAR_BYTES:
        raise bad_request(f"{prefix}{param} is larger than {MAX_GRAMMAR_BYTES} bytes", param=prefix + param)
    return worker_pb2.Grammar(kind=kind, spec=spec), prefix + param
