"""pdorch's configuration schema as JSON Schema, derived from pdorch/config.py's field metadata.

The same `help` / `min` / `max` / `choices` / `format` / `required` / `required_when` rules that the
config loader enforces, so a tool that validates JSON Schema (Helm's `values.schema.json`, editors)
rejects what the loader rejects. Two rules have no JSON Schema form: `below` / `at_most` (a key that must be
smaller than / at most another key); they are stated in the key's description and checked by the loader.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pdorch.config import Config
from pdorch.config_values import FORMATS, field_default, field_kind

_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string"}


def config_json_schema() -> dict[str, Any]:
    """{"type": "object", "properties": {section: {...}}} for a whole pdorch YAML config."""
    sections = {f.name: _section(f.default_factory) for f in dataclasses.fields(Config)}
    return {"type": "object", "additionalProperties": False, "properties": sections,
            "description": "pdorch configuration (docs/configuration.md)"}


def _section(cls: type) -> dict[str, Any]:
    props: dict[str, Any] = {}
    conditions: list[dict[str, Any]] = []
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for f in fields.values():
        kind = field_kind(f, cls)
        props[f.name] = _key(f, kind)
        when = f.metadata.get("required_when")
        if when:
            other, value = when
            conditions.append(_required_when(f.name, kind, other, value, field_default(fields[other])))
    schema: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": props,
                              "description": (cls.__doc__ or "").strip()}
    if conditions:
        schema["allOf"] = conditions
    return schema


def _key(f: dataclasses.Field, kind: type | str) -> dict[str, Any]:
    meta = f.metadata
    description = meta.get("help", "")
    if meta.get("below"):
        description += f" (must be below {meta['below']})"
    if meta.get("at_most"):
        description += f" (must be at most {meta['at_most']})"
    item = _string(meta) if kind in ("list", str) else {"type": _TYPES[kind]}
    if kind in (int, float):
        if meta.get("min") is not None:
            item["minimum"] = meta["min"]
        if meta.get("max") is not None:
            item["maximum"] = meta["max"]
    schema = {"type": "array", "items": item} if kind == "list" else item
    if meta.get("required"):
        schema["minItems" if kind == "list" else "minLength"] = 1
    if "auto" in meta:  # the number, the word auto, or auto's stored value (what a dumped config holds)
        schema = {"anyOf": [schema, {"enum": ["auto", meta["auto"]]}]}
    default = field_default(f)
    schema["default"] = list(default) if isinstance(default, tuple) else default
    schema["description"] = description
    return schema


def _string(meta) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    if "choices" in meta:
        schema["enum"] = list(meta["choices"])
    elif meta.get("format"):
        # NOTE: empty passes (emptiness is the business of required / required_when), as in the loader.
        schema["pattern"] = f"^(?:{FORMATS[meta['format']][0]})?$"
    return schema


def _required_when(name: str, kind: type | str, other: str, value: Any, other_default: Any) -> dict[str, Any]:
    """`name` must not be empty when `other` == value (explicitly, or by its default)."""
    is_value = {"properties": {other: {"const": value}}, "required": [other]}
    condition = {"anyOf": [is_value, {"not": {"required": [other]}}]} if other_default == value else is_value
    non_empty = {"minItems": 1} if kind == "list" else {"minLength": 1}
    return {"if": condition, "then": {"properties": {name: non_empty}}}
