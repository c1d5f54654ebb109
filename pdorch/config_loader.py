"""Load the YAML configuration into the frozen schema of `pdorch/config.py` (docs/design.md section 7).

Precedence, lowest first:  dataclass defaults < YAML file < env PDORCH_<SECTION>_<KEY> < --set flags.

Every mistake (unknown section or key, wrong type, out-of-range number, bad choice, missing required
value) is collected; start-up stops with one ConfigError listing them, each line naming the key path,
what was expected, what was given and where it came from:

    decode.max_running_requests: expected an integer >= 1, got "many" (x.yaml line 12)

Every entry point (`python -m prefill_node|decode_node|router`, `pdorch serve`) uses
`add_config_args` + `config_from_args`.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from pdorch.config import Config
from pdorch.config_values import BadValue, check, field_default, field_kind, show

ENV_PREFIX = "PDORCH_"
SECTIONS: dict[str, type] = {f.name: f.default_factory for f in dataclasses.fields(Config)}


class ConfigError(ValueError):
    """The configuration is invalid; the message names every bad key (one per line)."""


def default_config_path() -> Path:
    """configs/local.yaml, the embedded default that `pdorch serve` uses with no --config.

    NOTE: resolved relative to this package: right for a source checkout and for the editable
    install `make setup` does (the package stays in the checkout).
    """
    return Path(__file__).resolve().parent.parent / "configs" / "local.yaml"


def env_var(section: str, key: str) -> str:
    """The env var that overrides `section.key`, e.g. PDORCH_DECODE_MAX_RUNNING_REQUESTS."""
    return f"{ENV_PREFIX}{section.upper()}_{key.upper()}"


def load_config(path: str | os.PathLike | None, overrides: Mapping[str, Any] | None = None,
                environ: Mapping[str, str] | None = None) -> Config:
    """Defaults, then the YAML file at `path` (None: none), then env vars, then `overrides`.

    `overrides` maps "section.key" to a string parsed like an env var (a typed value is checked
    as is). `environ` defaults to os.environ. Raises ConfigError naming every bad key.
    """
    values: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    errors: list[str] = []
    if path is not None:
        for section, key, value, where in _file_items(Path(path), errors):
            _put(values, errors, section, key, value, where, from_string=False)
    env = os.environ if environ is None else environ
    for name in sorted(env):
        item = _env_item(name)
        if item is not None:
            _put(values, errors, item[0], item[1], env[name], f"env {name}", from_string=True)
    for dotted, value in (overrides or {}).items():
        section, _, key = dotted.partition(".")
        if not key:
            errors.append(f"{dotted}: expected section.key=value in --set")
            continue
        _put(values, errors, section, key, value, "--set", from_string=True)
    config = _build(values, errors)
    if errors:
        raise ConfigError("\n".join(errors))
    return config


def add_config_args(parser: argparse.ArgumentParser) -> None:
    """Add `--config FILE` and repeatable `--set section.key=value` to an argparse parser."""
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="YAML config file (docs/configuration.md lists every key)")
    parser.add_argument("--set", metavar="SECTION.KEY=VALUE", action="append", default=[],
                        dest="config_overrides",
                        help="override one key, e.g. --set decode.max_running_requests=8 (repeatable; "
                             "beats the file and PDORCH_* env vars)")


def parse_overrides(items: list[str] | None) -> dict[str, str]:
    """["a.b=1", "c.d=x=y"] -> {"a.b": "1", "c.d": "x=y"}; a later item for the same key wins."""
    result: dict[str, str] = {}
    for item in items or []:
        dotted, sep, value = item.partition("=")
        if not sep or "." not in dotted:
            raise ConfigError(f"--set {item}: expected section.key=value, e.g. decode.port=50171")
        result[dotted.strip()] = value
    return result


def config_from_args(args: argparse.Namespace, default_path: str | os.PathLike | None = None,
                     environ: Mapping[str, str] | None = None) -> Config:
    """The Config for parsed `add_config_args` arguments (`default_path` when no --config given)."""
    path = args.config if args.config is not None else default_path
    return load_config(path, parse_overrides(getattr(args, "config_overrides", None)), environ)


def exit_on_config_error(error: ConfigError, prog: str) -> None:
    """Print a ConfigError the way every entry point does and exit with status 2."""
    sys.stderr.write(f"{prog}: invalid configuration:\n")
    for line in str(error).splitlines():
        sys.stderr.write(f"  {line}\n")
    raise SystemExit(2)


def config_to_dict(config: Config) -> dict[str, dict[str, Any]]:
    """A plain dict (lists instead of tuples) that `load_config` reads back to an equal Config."""
    return {name: {k: list(v) if isinstance(v, tuple) else v
                   for k, v in dataclasses.asdict(getattr(config, name)).items()}
            for name in SECTIONS}


def dump_config(config: Config, path: str | os.PathLike) -> None:
    """Write `config` as YAML (the launcher hands every child the same effective file)."""
    Path(path).write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))


def _file_items(path: Path, errors: list[str]):
    """(section, key, value, where) for each key in the YAML file; structural errors go to `errors`."""
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror or e}") from None
    try:
        data = yaml.safe_load(text)
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if data is None:
        return
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections ({', '.join(SECTIONS)}), "
                          f"got {show(data)}")
    lines = _key_lines(root)
    for section, body in data.items():
        where = f"{path} line {lines.get((section,), '?')}"
        if section not in SECTIONS:
            errors.append(f"{section}: unknown section{_suggest(str(section), SECTIONS)} ({where})")
            continue
        if body is None:  # a section whose keys are all commented out
            continue
        if not isinstance(body, dict):
            errors.append(f"{section}: expected a mapping of keys, got {show(body)} ({where})")
            continue
        for key, value in body.items():
            yield section, key, value, f"{path} line {lines.get((section, key), '?')}"


def _key_lines(root) -> dict[tuple, int]:
    """(section,) and (section, key) -> 1-based line in the YAML text, for error messages."""
    lines: dict[tuple, int] = {}
    if not isinstance(root, yaml.MappingNode):
        return lines
    for knode, vnode in root.value:
        lines[(knode.value,)] = knode.start_mark.line + 1
        if isinstance(vnode, yaml.MappingNode):
            for k2, _ in vnode.value:
                lines[(knode.value, k2.value)] = k2.start_mark.line + 1
    return lines


def _env_item(name: str) -> tuple[str, str] | None:
    """PDORCH_DECODE_PORT -> ("decode", "port"); None for env vars outside the config sections.

    NOTE: any PDORCH_<SECTION>_* var is treated as config, so a typo is an error, not ignored.
    Other PDORCH_* names (no section prefix) are left alone.
    """
    if not name.startswith(ENV_PREFIX):
        return None
    rest = name[len(ENV_PREFIX):].lower()
    for section in SECTIONS:
        if rest.startswith(section + "_") and len(rest) > len(section) + 1:
            return section, rest[len(section) + 1:]
    return None


def _put(values, errors, section, key, value, where: str, from_string: bool) -> None:
    """Check one value against its key and record it (or the error naming it)."""
    if section not in SECTIONS:
        errors.append(f"{section}: unknown section{_suggest(str(section), SECTIONS)} ({where})")
        return
    fields = {f.name: f for f in dataclasses.fields(SECTIONS[section])}
    if key not in fields:
        errors.append(f"{section}.{key}: unknown key{_suggest_key(section, str(key), fields)} ({where})")
        return
    f = fields[key]
    try:
        values[section][key] = check(value, field_kind(f, SECTIONS[section]), f.metadata, from_string)
    except BadValue as bad:
        hint = f"; {bad.hint}" if bad.hint else ""
        errors.append(f"{section}.{key}: expected {bad.expected}, got {show(value)}{hint} ({where})")


def _build(values, errors) -> Config:
    """The frozen Config from checked values; missing required values are added to `errors`."""
    sections = {}
    for name, cls in SECTIONS.items():
        merged = {}
        for f in dataclasses.fields(cls):
            value = values[name].get(f.name, field_default(f))
            if value is dataclasses.MISSING:
                errors.append(f"{name}.{f.name}: missing required value; set it in the config file, "
                              f"env {env_var(name, f.name)} or --set {name}.{f.name}=...")
                continue
            merged[f.name] = value
        for f in dataclasses.fields(cls):
            cond = f.metadata.get("required_when")
            needed = f.metadata.get("required") or (cond is not None and merged.get(cond[0]) == cond[1])
            if needed and f.name in merged and merged[f.name] in ("", ()):
                conditional = cond is not None and not f.metadata.get("required")
                why = f" when {name}.{cond[0]} is {show(cond[1])}" if conditional else ""
                errors.append(f"{name}.{f.name}: missing required value{why}; "
                              f"got {show(merged[f.name])}")
        for f in dataclasses.fields(cls):
            other = f.metadata.get("below")  # an ordering between two keys of one section
            if other and f.name in merged and other in merged and not merged[f.name] < merged[other]:
                errors.append(f"{name}.{f.name}: expected a value below {name}.{other} "
                              f"({show(merged[other])}), got {show(merged[f.name])}")
            other = f.metadata.get("at_most")  # e.g. planner.min_prefill <= planner.max_prefill
            if other and f.name in merged and other in merged and not merged[f.name] <= merged[other]:
                errors.append(f"{name}.{f.name}: expected a value at most {name}.{other} "
                              f"({show(merged[other])}), got {show(merged[f.name])}")
        if len(merged) == len(dataclasses.fields(cls)):
            sections[name] = cls(**merged)
    return Config(**sections) if len(sections) == len(SECTIONS) else Config()


def _suggest(word: str, options) -> str:
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else f"; expected one of {', '.join(options)}"


def _suggest_key(section: str, key: str, fields) -> str:
    # NOTE: the exact key in another section first (decode.page_size is model.page_size, not decode.tp_size)
    elsewhere = [s for s, cls in SECTIONS.items()
                 if s != section and key in {f.name for f in dataclasses.fields(cls)}]
    if elsewhere:
        return f"; {key} belongs in section {elsewhere[0]}"
    close = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.6)
    if close:
        return f"; did you mean {section}.{close[0]}?"
    return f"; {section} keys: {', '.join(fields)}"
