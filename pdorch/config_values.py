"""One config value: its type and rules (from the schema's field metadata), checked and coerced.

The same rules apply to values from YAML (already typed by the YAML parser) and to values from
env vars / `--set` flags (always strings, parsed here). A bad value raises `BadValue` carrying what
was expected; the loader adds the key path and where the value came from.
"""

from __future__ import annotations

import json
import math
import re
import typing
from dataclasses import MISSING, Field
from typing import Any

import yaml

# Named formats for string values: regex the whole value must match, what one value is, what a
# list of them is (the words finish "expected ...").
FORMATS: dict[str, tuple[str, str, str]] = {
    "host:port": (r"[^\s:/]+:\d{1,5}|\[[0-9a-fA-F:]+\]:\d{1,5}", "a host:port address",
                  "a list of host:port addresses"),
    # store.master_address: one master's host:port, or masters in HA mode behind etcd
    # (store_client/addresses.py parses it)
    "master_address": (r"[^\s:/;]+:\d{1,5}|\[[0-9a-fA-F:]+\]:\d{1,5}|etcd://([^\s:/;]+:\d{1,5})(;(etcd://)?[^\s:/;]+:\d{1,5})*",
                       "host:port (one master) or etcd://host:port;etcd://host:port;... (masters in HA mode)",
                       "a list of master addresses"),
    # store.metadata_server: an HTTP metadata server's URL, or the transfer engine's metadata in etcd
    "metadata_server": (r"P2PHANDSHAKE|https?://[^\s/]+(/\S*)?|etcd://([^\s:/;]+:\d{1,5})(;(etcd://)?[^\s:/;]+:\d{1,5})*",
                        "http://host:port/path, etcd://host:port;etcd://host:port;... or P2PHANDSHAKE",
                        "a list of metadata servers"),
    "http_url": (r"https?://[^\s/]+(/\S*)?", "an http:// or https:// URL", "a list of http:// or https:// URLs"),
    "device": (r"cpu|cuda(:\d+)?", "a torch device (cpu, cuda or cuda:N)", "a list of torch devices"),
    # Mooncake refuses a relative offload path or one with a `..` component (it checks at setup).
    # No lookahead: the chart's JSON Schema takes the same pattern, and helm's regexps lack it.
    "abspath": (r"(/([^/.][^/]*|\.|\.[^/.][^/]*|\.\.[^/]+)?)+", "an absolute path without `..`", "a list of absolute paths"),
}
_PLAIN = (None, "a string", "a list of strings")

_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


class BadValue(ValueError):
    """A value does not fit its key. `expected` finishes the sentence "expected ..."."""

    def __init__(self, expected: str, hint: str = ""):
        super().__init__(expected)
        self.expected = expected
        self.hint = hint


def field_kind(f: Field, owner: type) -> type | str:
    """The key's value kind: bool, int, float, str, or "list" for tuple[str, ...]."""
    hint = typing.get_type_hints(owner)[f.name]
    if typing.get_origin(hint) is tuple:
        return "list"
    if hint not in (bool, int, float, str):
        raise TypeError(f"unsupported config type {hint!r} for {owner.__name__}.{f.name}")
    return hint


def field_default(f: Field) -> Any:
    """The key's default, or MISSING for a required key."""
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


def describe(kind: type | str, meta: typing.Mapping) -> str:
    """What a key accepts, as in "expected an integer >= 1" (also used by docs/configuration.md)."""
    if "auto" in meta:  # a number, or the word auto (stored as meta["auto"], e.g. 0)
        return describe(kind, {k: v for k, v in meta.items() if k != "auto"}) + " or auto"
    if kind is bool:
        return "true or false"
    if kind in (int, float) and "choices" in meta:
        return "one of " + ", ".join(map(str, meta["choices"]))
    if kind in (int, float):
        noun = "an integer" if kind is int else "a number"
        lo, hi = meta.get("min"), meta.get("max")
        if lo is not None and hi is not None:
            return f"{noun} between {lo} and {hi}"
        if lo is not None:
            return f"{noun} >= {lo}"
        if hi is not None:
            return f"{noun} <= {hi}"
        return noun
    if "choices" in meta:
        return "one of " + ", ".join(map(str, meta["choices"]))
    _, one, many = FORMATS.get(meta.get("format", ""), _PLAIN)
    return many if kind == "list" else one


def show(value: Any) -> str:
    """A value as the user wrote it: strings quoted, YAML spellings for booleans and null."""
    if value is None:
        return "nothing (an empty value)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, list, tuple, dict)):
        text = json.dumps(list(value) if isinstance(value, tuple) else value, default=str)
        return text if len(text) <= 80 else text[:77] + "..."
    return repr(value)


def check(value: Any, kind: type | str, meta: typing.Mapping, from_string: bool) -> Any:
    """The value coerced to its kind and checked against the key's rules; raises BadValue."""
    expected = describe(kind, meta)
    if "auto" in meta and value == "auto":
        return meta["auto"]
    if from_string:
        value = _parse_string(value, kind, expected)
    if "auto" in meta and value == meta["auto"] and not isinstance(value, bool):
        return value  # auto's stored value, as a dumped config holds it
    if kind is bool:
        if not isinstance(value, bool):
            raise BadValue(expected)
        return value
    if kind in (int, float):
        return _check_number(value, kind, meta, expected)
    if kind == "list":
        if not isinstance(value, (list, tuple)):
            hint = f"write a YAML list, e.g. [{value}]" if isinstance(value, str) else ""
            raise BadValue(expected, hint)
        items = tuple(value)
        for item in items:
            if not isinstance(item, str):
                raise BadValue(expected, f"item {show(item)} is not a string")
            _check_string(item, meta, expected)
        return items
    if not isinstance(value, str):
        # NOTE: YAML turns unquoted 0123, 1e3, yes, 12:30 into numbers/booleans; quoting fixes it.
        raise BadValue(expected, "quote it in YAML" if isinstance(value, (int, float)) else "")
    _check_string(value, meta, expected)
    return value


def _parse_string(text: Any, kind: type | str, expected: str) -> Any:
    """An env var / --set value (a string) parsed into the key's kind; unparseable -> BadValue."""
    if not isinstance(text, str):
        return text  # a typed value passed programmatically: checked like a YAML value
    stripped = text.strip()
    if kind is bool:
        low = stripped.lower()
        if low in _TRUE or low in _FALSE:
            return low in _TRUE
        return text
    if kind is int:
        try:
            return int(stripped)
        except ValueError:
            return text
    if kind is float:
        try:
            return float(stripped)
        except ValueError:
            return text
    if kind == "list":
        if stripped.startswith("["):
            try:
                return yaml.safe_load(stripped)
            except yaml.YAMLError:
                raise BadValue(expected, "not a valid list; write a,b or [a, b]") from None
        return [item.strip() for item in stripped.split(",") if item.strip()]
    return text


def _check_number(value: Any, kind: type, meta: typing.Mapping, expected: str) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadValue(expected)
    if kind is int and not isinstance(value, int):
        raise BadValue(expected)
    if kind is float:
        value = float(value)
        if not math.isfinite(value):
            raise BadValue(expected)
    lo, hi = meta.get("min"), meta.get("max")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise BadValue(expected)
    if "choices" in meta and value not in meta["choices"]:
        raise BadValue(expected)
    return value


def _check_string(value: str, meta: typing.Mapping, expected: str) -> None:
    if "choices" in meta and value not in meta["choices"]:
        raise BadValue(expected)
    fmt = meta.get("format")
    if fmt and value:  # emptiness is the business of `required` / `required_when`
        pattern = FORMATS[fmt][0]
        if not re.fullmatch(pattern, value):
            raise BadValue(expected)
        if fmt == "host:port" and not 1 <= int(value.rsplit(":", 1)[1]) <= 65535:
            raise BadValue(expected, "port out of range")
        if fmt in ("master_address", "metadata_server") and not all(
                1 <= int(port) <= 65535 for port in re.findall(r":(\d{1,5})(?=;|/|$)", value)):
            raise BadValue(expected, "port out of range")
