"""pdorch.config_loader: every class of mistake names its key; env and --set override single keys."""

from __future__ import annotations

import argparse
import textwrap

import pytest

from pdorch.config import Config
from pdorch.config_loader import (
    ConfigError,
    add_config_args,
    config_from_args,
    config_to_dict,
    default_config_path,
    dump_config,
    load_config,
    parse_overrides,
)


def write(tmp_path, text: str):
    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def error_of(tmp_path, text: str, **kw) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, text), environ=kw.pop("environ", {}), **kw)
    return str(e.value)


def test_no_file_gives_the_schema_defaults():
    assert load_config(None, environ={}) == Config()


def test_embedded_local_yaml_loads_with_store_on_and_one_worker_each():
    cfg = load_config(default_config_path(), environ={})
    assert cfg.model.source == "smollm2"
    assert cfg.store.enabled and cfg.decode.offload_generated_kv
    assert cfg.discovery.mode == "static"
    assert cfg.discovery.prefill == (f"127.0.0.1:{cfg.prefill.port}",)
    assert cfg.discovery.decode == (f"127.0.0.1:{cfg.decode.port}",)
    hosts = {cfg.prefill.host, cfg.decode.host, cfg.router.host, cfg.store.local_hostname}
    assert hosts == {"127.0.0.1"}


def test_values_from_file_are_typed(tmp_path):
    cfg = load_config(write(tmp_path, """
        decode: {max_running_requests: 8, kv_watermark: 1}
        store: {enabled: false}
        discovery: {prefill: ["10.0.0.1:7000", "10.0.0.2:7000"]}
        model:
    """), environ={})
    assert cfg.decode.max_running_requests == 8
    assert cfg.decode.kv_watermark == 1.0 and isinstance(cfg.decode.kv_watermark, float)
    assert cfg.store.enabled is False
    assert cfg.discovery.prefill == ("10.0.0.1:7000", "10.0.0.2:7000")


def test_wrong_type_names_key_expectation_and_value(tmp_path):
    msg = error_of(tmp_path, "decode:\n  max_running_requests: many\n")
    assert msg.startswith('decode.max_running_requests: expected an integer >= 1, got "many"')
    assert "line 2" in msg


@pytest.mark.parametrize("yaml_text, expected", [
    ("store: {enabled: 1}", "store.enabled: expected true or false, got 1"),
    ("prefill: {port: 50161.5}", "prefill.port: expected an integer between 1 and 65535, got 50161.5"),
    ("router: {api_key: 12345}", "router.api_key: expected a string, got 12345; quote it in YAML"),
    ("discovery: {decode: 127.0.0.1:1}",
     'discovery.decode: expected a list of host:port addresses, got "127.0.0.1:1"; write a YAML list'),
    ("decode: {kv_watermark: high}", 'decode.kv_watermark: expected a number between 0.1 and 1.0, got "high"'),
    ("prefill: {port:}", "prefill.port: expected an integer between 1 and 65535, got nothing"),
])
def test_wrong_types(tmp_path, yaml_text, expected):
    assert error_of(tmp_path, yaml_text).startswith(expected)


@pytest.mark.parametrize("yaml_text, expected", [
    ("prefill: {port: 70000}", "prefill.port: expected an integer between 1 and 65535, got 70000"),
    ("decode: {kv_watermark: 1.5}", "decode.kv_watermark: expected a number between 0.1 and 1.0, got 1.5"),
    ("decode: {max_running_requests: 0}", "decode.max_running_requests: expected an integer >= 1, got 0"),
    ("store: {op_timeout_s: .nan}", "store.op_timeout_s: expected a number >= 0.1, got nan"),
])
def test_out_of_range(tmp_path, yaml_text, expected):
    assert error_of(tmp_path, yaml_text).startswith(expected)


@pytest.mark.parametrize("yaml_text, expected", [
    ("router: {policy: fastest}",
     'router.policy: expected one of cache_aware, least_load, round_robin, got "fastest"'),
    ("model: {device: gpu}", 'model.device: expected a torch device (cpu, cuda or cuda:N), got "gpu"'),
    ("discovery: {prefill: [localhost]}",
     'discovery.prefill: expected a list of host:port addresses, got ["localhost"]'),
    ("store: {master_address: 'h:99999'}",
     ('store.master_address: expected host:port (one master) or etcd://host:port;etcd://host:port;... (masters '
     'in HA mode), got "h:99999"; port out of range')),
])
def test_bad_choices_and_formats(tmp_path, yaml_text, expected):
    assert error_of(tmp_path, yaml_text).startswith(expected)


@pytest.mark.parametrize("yaml_text, expected", [
    ("decode: {max_runing_requests: 4}",
     "decode.max_runing_requests: unknown key; did you mean decode.max_running_requests?"),
    ("decoder: {port: 1}", "decoder: unknown section; did you mean decode?"),
    ("decode: {page_size: 32}", "decode.page_size: unknown key; page_size belongs in section model"),
    ("router: {zzz: 1}", "router.zzz: unknown key; router keys: host, port, policy"),
    ("nonsense: 1", "nonsense: unknown section; expected one of model, store, prefill"),
])
def test_unknown_keys_suggest_the_closest_name(tmp_path, yaml_text, expected):
    assert error_of(tmp_path, yaml_text).startswith(expected)


@pytest.mark.parametrize("yaml_text, expected", [
    ("model: {source: ''}", 'model.source: missing required value; got ""'),
    ("discovery: {mode: static, decode: []}",
     "discovery.decode: missing required value when discovery.mode is \"static\"; got []"),
    ("discovery: {mode: etcd, etcd_endpoints: []}",
     "discovery.etcd_endpoints: missing required value when discovery.mode is \"etcd\""),
    ("store: {master_address: ''}", "store.master_address: missing required value when store.enabled is true"),
])
def test_missing_required_values(tmp_path, yaml_text, expected):
    assert error_of(tmp_path, yaml_text).startswith(expected)


def test_conditionally_required_values_may_be_empty_otherwise(tmp_path):
    cfg = load_config(write(tmp_path, """
        discovery: {mode: etcd, prefill: [], decode: []}
        store: {enabled: false, master_address: ""}
    """), environ={})
    assert cfg.discovery.prefill == () and cfg.store.master_address == ""


def test_all_mistakes_are_reported_at_once_one_per_line(tmp_path):
    lines = error_of(tmp_path, """
        decode: {max_running_requests: many, port: 0}
        router: {policy: x}
    """).splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "decode.max_running_requests", "decode.port", "router.policy"]


@pytest.mark.parametrize("text, expected", [
    ("- a\n- b\n", "expected a mapping of sections"),
    ("decode: [1, 2]\n", "decode: expected a mapping of keys, got [1, 2]"),
    ("decode: {port: [\n", "not valid YAML"),
])
def test_malformed_files(tmp_path, text, expected):
    assert expected in error_of(tmp_path, text)


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file .*nope.yaml"):
        load_config(tmp_path / "nope.yaml", environ={})


def test_env_overrides_file(tmp_path):
    path = write(tmp_path, "decode: {max_running_requests: 8}\nrouter: {port: 9000}\n")
    env = {"PDORCH_DECODE_MAX_RUNNING_REQUESTS": "4", "PDORCH_STORE_ENABLED": "off",
           "PDORCH_DISCOVERY_PREFILL": "a:1, b:2", "PDORCH_ROUTER_API_KEY": "sk-1",
           "PDORCH_LOG_DIR": "/elsewhere", "HOME": "/x"}  # non-config names are left alone
    cfg = load_config(path, environ=env)
    assert cfg.decode.max_running_requests == 4
    assert cfg.router.port == 9000
    assert cfg.store.enabled is False
    assert cfg.discovery.prefill == ("a:1", "b:2")
    assert cfg.router.api_key == "sk-1"


def test_environ_defaults_to_os_environ(monkeypatch):
    monkeypatch.setenv("PDORCH_PREFILL_CHUNK_TOKENS", "64")
    assert load_config(None).prefill.chunk_tokens == 64


def test_bad_env_value_names_the_variable():
    with pytest.raises(ConfigError) as e:
        load_config(None, environ={"PDORCH_DECODE_MAX_RUNNING_REQUESTS": "many"})
    assert str(e.value) == ('decode.max_running_requests: expected an integer >= 1, got "many" '
                            "(env PDORCH_DECODE_MAX_RUNNING_REQUESTS)")


def test_misspelt_env_var_of_a_section_is_an_error():
    with pytest.raises(ConfigError, match=r"router.apikey: unknown key; did you mean router.api_key\? "
                                          r"\(env PDORCH_ROUTER_APIKEY\)"):
        load_config(None, environ={"PDORCH_ROUTER_APIKEY": "x"})


def test_flags_override_env_and_file(tmp_path):
    path = write(tmp_path, "decode: {max_running_requests: 8}\n")
    parser = argparse.ArgumentParser()
    add_config_args(parser)
    args = parser.parse_args(["--config", str(path), "--set", "decode.max_running_requests=2",
                              "--set", "discovery.decode=[x:1, y:2]", "--set", "router.api_key=a=b"])
    cfg = config_from_args(args, environ={"PDORCH_DECODE_MAX_RUNNING_REQUESTS": "4"})
    assert cfg.decode.max_running_requests == 2
    assert cfg.discovery.decode == ("x:1", "y:2")
    assert cfg.router.api_key == "a=b"


def test_default_path_used_only_without_config_flag(tmp_path):
    parser = argparse.ArgumentParser()
    add_config_args(parser)
    default = write(tmp_path, "router: {port: 9001}\n")
    assert config_from_args(parser.parse_args([]), default_path=default, environ={}).router.port == 9001
    assert config_from_args(parser.parse_args([]), environ={}) == Config()


@pytest.mark.parametrize("overrides, expected", [
    ({"decode.port": "x"}, 'decode.port: expected an integer between 1 and 65535, got "x" (--set)'),
    ({"decode.prot": "1"}, "decode.prot: unknown key; did you mean decode.port? (--set)"),
    ({"store.enabled": "maybe"}, 'store.enabled: expected true or false, got "maybe" (--set)'),
    ({"store.op_timeout_s": "inf"}, 'store.op_timeout_s: expected a number >= 0.1, got "inf" (--set)'),
    ({"decode": "1"}, "decode: expected section.key=value in --set"),
])
def test_bad_overrides(overrides, expected):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides, environ={})
    assert str(e.value) == expected


def test_malformed_set_flag():
    with pytest.raises(ConfigError, match="--set decode.port: expected section.key=value"):
        parse_overrides(["decode.port"])
    assert parse_overrides(["a.b=1", "a.b=2"]) == {"a.b": "2"}


def test_dump_round_trips(tmp_path):
    cfg = load_config(None, {"discovery.prefill": "a:1,b:2", "decode.kv_watermark": "0.5"}, environ={})
    dump_config(cfg, tmp_path / "out.yaml")
    assert load_config(tmp_path / "out.yaml", environ={}) == cfg
    assert config_to_dict(cfg)["discovery"]["prefill"] == ["a:1", "b:2"]


@pytest.mark.parametrize("path", sorted((default_config_path().parent).glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_config_is_valid(path):
    assert isinstance(load_config(path, environ={}), Config)


def test_an_ordering_between_two_keys_is_checked():
    with pytest.raises(ConfigError, match=r"store.evict_low_watermark: expected a value below "
                                          r"store.evict_high_watermark \(0.5\), got 0.8"):
        load_config(None, {"store.evict_high_watermark": "0.5"}, environ={})
