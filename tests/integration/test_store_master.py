"""MasterProcess: a real mooncake_master on its own free ports, ready within a deadline, stopped by PID."""

from __future__ import annotations

import os
import socket
import urllib.request

import pytest

from store_client.master import MasterError, MasterProcess, find_master_binary


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_start_serves_metrics_and_metadata_then_stop_by_pid(tmp_path):
    m = MasterProcess(log_dir=str(tmp_path)).start()
    try:
        ports = {m.rpc_port, m.metadata_port, m.metrics_port}
        assert len(ports) == 3
        assert m.master_address == f"127.0.0.1:{m.rpc_port}"
        assert m.metadata_url == f"http://127.0.0.1:{m.metadata_port}/metadata"
        assert "master_key_count" in m.metrics_text()
        # The metadata server answers HTTP (404 for an unknown key is fine: it is up).
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(m.metadata_url + "?key=nothing", timeout=2)
        assert e.value.code == 404
        pid = m.pid
        assert m.running()
    finally:
        m.stop()
    assert not m.running()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not any(_port_open(p) for p in ports)
    m.stop()  # idempotent


def test_restart_keeps_the_same_ports(tmp_path):
    m = MasterProcess(log_dir=str(tmp_path)).start()
    try:
        before = (m.master_address, m.metadata_url, m.metrics_url, m.pid)
        m.kill()
        assert not m.running()
        m.restart()
        assert (m.master_address, m.metadata_url, m.metrics_url) == before[:3]
        assert m.pid != before[3]
        assert "master_key_count" in m.metrics_text()
    finally:
        m.stop()


def test_port_in_use_gives_a_clear_error(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        m = MasterProcess(rpc_port=port, log_dir=str(tmp_path))
        with pytest.raises(MasterError, match="mooncake_master"):
            m.start(timeout_s=10)
        assert not m.running()


def test_missing_binary_is_named(tmp_path, monkeypatch):
    assert os.path.basename(find_master_binary()) == "mooncake_master"
    monkeypatch.setattr("sys.executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(MasterError, match="mooncake_master not found"):
        find_master_binary()


def test_status_reads_fill_and_eviction_counters_from_a_real_master(mooncake_master):
    from dataclasses import replace

    from pdorch.config import StoreConfig
    from pdorch.status import fetch_store

    cfg = replace(StoreConfig(), master_address=mooncake_master.master_address,
                  master_metrics_port=mooncake_master.metrics_port)
    store = fetch_store(cfg)
    assert store["fill_ratio"] == 0.0 and store["keys"] == 0
    assert "evicted_keys" in store["master_eviction"]
    assert "error" in fetch_store(replace(cfg, master_metrics_port=1))
    assert fetch_store(replace(cfg, enabled=False)) is None
