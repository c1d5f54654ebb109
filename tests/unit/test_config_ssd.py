"""The SSD tier's keys: validated with errors naming the key; one directory per worker."""

from __future__ import annotations

import pytest

from pdorch.config_loader import ConfigError, load_config
from pdorch.master_cmd import master_process
from tests.unit.test_config_loader import error_of, write


@pytest.mark.parametrize("yaml_text, expected", [
    ("store: {ssd_path: relative/dir}", 'store.ssd_path: expected an absolute path without `..`, got "relative/dir"'),
    ("store: {ssd_path: /a/../b}", 'store.ssd_path: expected an absolute path without `..`, got "/a/../b"'),
    ("store: {ssd_path: /a/..}", 'store.ssd_path: expected an absolute path without `..`'),
    ("store: {ssd_capacity_gb: -1}", "store.ssd_capacity_gb: expected"),
    ("store: {ssd_capacity_gb: lots}", "store.ssd_capacity_gb: expected"),
])
def test_bad_ssd_values_name_the_key(tmp_path, yaml_text, expected):
    assert error_of(tmp_path, yaml_text).startswith(expected)


def test_ssd_off_by_default_and_on_with_a_path(tmp_path):
    assert not load_config(None, environ={}).store.ssd_enabled
    cfg = load_config(write(tmp_path, "store: {ssd_path: /var/ssd/a..b, ssd_capacity_gb: 1.5}"), environ={})
    assert cfg.store.ssd_enabled and cfg.store.ssd_capacity_gb == 1.5


@pytest.mark.parametrize("path", ["/", "/ssd", "/ssd/", "/var/.cache/a..b", "/..x/./y"])
def test_absolute_paths_without_dotdot_are_accepted(tmp_path, path):
    assert load_config(write(tmp_path, f"store: {{ssd_path: '{path}'}}"), environ={}).store.ssd_path == path


def test_each_worker_gets_its_own_directory(tmp_path):
    s = load_config(write(tmp_path, "store: {ssd_path: /ssd/}"), environ={}).store
    assert s.ssd_dir("127.0.0.1:15001") == "/ssd/127.0.0.1_15001"
    assert s.ssd_dir("127.0.0.1:15001") != s.ssd_dir("127.0.0.1:15002")
    assert "/" not in s.ssd_dir("../x/y")[len("/ssd/"):]  # a component name cannot leave the directory


def test_ssd_path_turns_the_masters_offload_on(tmp_path):
    off = master_process(load_config(None, environ={}))
    on = master_process(load_config(write(tmp_path, "store: {ssd_path: /ssd}"), environ={}))
    assert "--enable_offload=false" in off.command()
    assert "--enable_offload=true" in on.command()


def test_bad_ssd_path_is_refused_before_anything_starts(tmp_path):
    with pytest.raises(ConfigError, match="store.ssd_path"):
        load_config(write(tmp_path, "store: {ssd_path: ssd}"), environ={})


def test_with_the_ssd_tier_the_masters_eviction_governs(tmp_path):
    """A chain removal deletes a page's disk copy too (docs/workers.md): with ssd_path the master evicts."""
    assert load_config(write(tmp_path, "store: {}\n")).store.eviction_in_effect == "chain"
    ssd = load_config(write(tmp_path, "store: {ssd_path: /var/lib/pdorch/ssd}\n")).store
    assert ssd.eviction == "chain" and ssd.eviction_in_effect == "master"
    assert load_config(write(tmp_path, "store: {eviction: master}\n")).store.eviction_in_effect == "master"
