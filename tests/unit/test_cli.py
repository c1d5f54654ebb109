"""The `pdorch` command line: sub-commands, config errors, secrets never printed."""

from __future__ import annotations

import pytest
import yaml

from pdorch.cli import main
from pdorch.local_stack.processes import free_port


def test_config_prints_effective_values_with_secrets_redacted(capsys, monkeypatch):
    monkeypatch.setenv("PDORCH_ROUTER_ADMIN_KEY", "admin-secret")
    assert main(["config", "--set", "router.api_key=client-secret", "--set", "decode.port=6001"]) == 0
    out = capsys.readouterr().out
    assert "secret" not in out
    data = yaml.safe_load(out)
    assert data["router"]["api_key"] == data["router"]["admin_key"] == "<redacted>"
    assert data["decode"]["port"] == 6001
    assert data["model"]["source"] == "smollm2"  # the embedded configs/local.yaml


def test_invalid_config_exits_2_naming_the_key(capsys):
    with pytest.raises(SystemExit) as e:
        main(["serve", "--set", "decode.max_running_requests=many"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert 'decode.max_running_requests: expected an integer >= 1, got "many" (--set)' in err


def test_missing_config_file(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["config", "--config", str(tmp_path / "absent.yaml")])
    assert "cannot read config file" in capsys.readouterr().err


def test_status_without_a_router_says_so(capsys):
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["status", "--url", url]) == 1
    assert f"cannot reach the router at {url}/workers" in capsys.readouterr().err


def test_model_prepare_passes_through_to_the_engine(capsys):
    with pytest.raises(SystemExit) as e:
        main(["model", "prepare", "--help"])
    assert e.value.code == 0
    assert "usage: pdorch model prepare" in capsys.readouterr().out


def test_serve_rejects_abbreviated_flags(capsys):
    # the invalid router.port keeps a regression from starting a real cluster
    with pytest.raises(SystemExit) as e:
        main(["serve", "--prefil", "2", "--set", "router.port=0"])
    assert e.value.code == 2
    assert "unrecognized arguments: --prefil 2" in capsys.readouterr().err


def test_serve_tp_flags_set_the_workers_tp_size_for_every_child(monkeypatch):
    import pdorch.launcher

    seen = {}

    class Captured:  # in place of the cluster: what serve would launch with
        def __init__(self, cfg, config_path, overrides, opts):
            seen.update(cfg=cfg, overrides=overrides)

        def run(self):
            return 0

    monkeypatch.setattr(pdorch.launcher, "LocalCluster", Captured)
    assert main(["serve", "--prefill-tp", "2", "--decode-tp", "4"]) == 0
    assert (seen["cfg"].prefill.tp_size, seen["cfg"].decode.tp_size) == (2, 4)
    assert {"prefill.tp_size=2", "decode.tp_size=4"} <= set(seen["overrides"])  # the children's --set


def test_serve_refuses_a_tp_size_it_cannot_run(capsys):
    with pytest.raises(SystemExit) as e:
        main(["serve", "--prefill-tp", "3"])
    assert e.value.code == 2
    assert 'prefill.tp_size: expected one of 1, 2, 4, 8, got "3" (--set)' in capsys.readouterr().err
