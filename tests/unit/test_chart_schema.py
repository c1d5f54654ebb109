"""values.schema.json is generated from pdorch's config schema and agrees with the config loader.

For every config key, values the loader rejects (wrong type, out of range, unknown choice, bad
format, empty where required) are rejected by Helm's own schema validation too, and the defaults
pass both.
"""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from pdorch import chart_schema
from pdorch.config import Config
from pdorch.config_loader import ConfigError, load_config
from pdorch.config_values import field_default, field_kind
from tests.fixtures.chart import CHART_DIR


def _keys():
    for section in dataclasses.fields(Config):
        cls = section.default_factory
        for f in dataclasses.fields(cls):
            yield section.name, f, field_kind(f, cls)


def _bad_values(f: dataclasses.Field, kind) -> list:
    meta = f.metadata
    if kind is bool:
        return ["maybe", 1]
    if kind in (int, float):
        bad = ["12", [1]] + ([1.5] if kind is int else [])
        if meta.get("min") is not None:
            bad.append(meta["min"] - 1)
        if meta.get("max") is not None:
            bad.append(meta["max"] + 1)
        return bad
    if kind == "list":
        bad = ["a-string", [1]]
        if meta.get("format"):
            bad.append(["not an address"])
        if meta.get("required"):
            bad.append([])
        return bad
    bad = [5, ["x"]]
    if "choices" in meta:
        bad.append("no-such-choice")
    if meta.get("format"):
        bad.append("not an address")
    if meta.get("required"):
        bad.append("")
    return bad


CASES = [(s, f.name, v) for s, f, kind in _keys() for v in _bad_values(f, kind)]


@pytest.fixture(scope="module")
def chart():
    from helm_python import chart as helm_chart
    return helm_chart.Chart.load(str(CHART_DIR))


def _loader_accepts(tmp_path, section: str, key: str, value) -> bool:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({section: {key: value}}))
    try:
        load_config(path, environ={})
        return True
    except ConfigError:
        return False


def _helm_accepts(chart, section: str, key: str, value) -> bool:
    from helm_python import HelmValuesError
    try:
        chart.validate_schema({"config": {section: {key: value}}})
        return True
    except HelmValuesError:
        return False


def test_committed_schema_is_current():
    assert chart_schema.main(["--check"]) == 0, "run: python -m pdorch.chart_schema"


@pytest.mark.parametrize("section, key, value", CASES, ids=[f"{s}.{k}={v!r}" for s, k, v in CASES])
def test_loader_and_helm_reject_the_same_value(chart, tmp_path, section, key, value):
    assert not _loader_accepts(tmp_path, section, key, value), "the case should be a bad value"
    assert not _helm_accepts(chart, section, key, value), f"helm accepted {section}.{key}={value!r}"


@pytest.mark.parametrize("section, key", [(s, f.name) for s, f, _ in _keys()])
def test_defaults_pass_both(chart, tmp_path, section, key):
    cls = {f.name: f.default_factory for f in dataclasses.fields(Config)}[section]
    default = field_default({f.name: f for f in dataclasses.fields(cls)}[key])
    value = list(default) if isinstance(default, tuple) else default
    assert _loader_accepts(tmp_path, section, key, value)
    assert _helm_accepts(chart, section, key, value)


def test_unknown_section_and_key_rejected_by_both(chart, tmp_path):
    assert not _loader_accepts(tmp_path, "router", "polcy", "x")
    assert not _helm_accepts(chart, "router", "polcy", "x")
    from helm_python import HelmValuesError
    with pytest.raises(HelmValuesError):
        chart.validate_schema({"config": {"routr": {}}})


def test_required_when_rule(chart, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"discovery": {"mode": "etcd", "etcd_endpoints": []}}))
    with pytest.raises(ConfigError):
        load_config(path, environ={})
    from helm_python import HelmValuesError
    with pytest.raises(HelmValuesError, match="etcd_endpoints"):
        chart.validate_schema({"config": {"discovery": {"mode": "etcd", "etcd_endpoints": []}}})
    # static is the default mode: an empty static list is refused even when mode is not written
    with pytest.raises(HelmValuesError, match="prefill"):
        chart.validate_schema({"config": {"discovery": {"prefill": []}}})
    chart.validate_schema({"config": {"discovery": {"mode": "etcd", "prefill": []}}})
