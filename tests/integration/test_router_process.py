"""`python -m router` as a process: config file + --set + PDORCH_ROUTER_* env keys, bad config
exits naming the key, keys never reach the log, SIGTERM stops it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx

from pdorch.config_loader import dump_config
from pdorch.local_stack.processes import free_port, stop_process, wait_for_port
from pdorch.local_stack.router import router_config

ROOT = Path(__file__).resolve().parents[2]


def test_router_process_reads_config_env_keys_and_never_logs_them(tmp_path, standins, tiny_model_dir):
    import dataclasses

    p, d = standins("prefill"), standins("decode")
    cfg = router_config([p.address], [d.address], policy="cache_aware")
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, source=str(tiny_model_dir),
                                                             cache_dir=str(tmp_path / "models")))
    path = tmp_path / "router.yaml"
    dump_config(cfg, path)
    port = free_port()
    log = tmp_path / "router.log"
    env = dict(os.environ, PDORCH_ROUTER_API_KEY="sk-env-client-123", PDORCH_ROUTER_ADMIN_KEY="sk-env-admin-456")
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "router", "--config", str(path), "--set", f"router.port={port}",
                                 "--log-level", "debug"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        wait_for_port(port, 60, proc)
        c = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
        body = {"input_ids": list(range(1, 40)), "sampling_params": {"max_new_tokens": 2}}
        assert c.post("/generate", json=body).status_code == 401
        assert c.post("/generate", json=body, headers={"Authorization": "Bearer sk-wrong"}).status_code == 401
        ok = c.post("/generate", json=body, headers={"Authorization": "Bearer sk-env-client-123"})
        assert ok.status_code == 200 and ok.json()["output_ids"] == [1000, 1001]
        assert c.get("/workers", headers={"Authorization": "Bearer sk-env-admin-456"}).status_code == 200
        assert c.get("/server_info", headers={"Authorization": "Bearer sk-env-client-123"}).json()["policy"] == \
            "cache_aware"
    finally:
        stop_process(proc)
    assert proc.returncode is not None
    text = log.read_text()
    assert "sk-env-client-123" not in text and "sk-env-admin-456" not in text and "sk-wrong" not in text


def test_bad_config_exits_2_naming_the_key(tmp_path):
    out = subprocess.run([sys.executable, "-m", "router", "--set", "router.policy=fastest",
                          "--set", "router.port=0"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.returncode == 2
    assert "router.policy" in out.stderr and "router.port" in out.stderr


def test_metrics_on_a_port_of_their_own_and_only_metrics_there(tmp_path, standins, tiny_model_dir):
    """router.metrics_port: Prometheus scrapes there when a NetworkPolicy closes the API port to it."""
    import dataclasses

    p, d = standins("prefill"), standins("decode")
    cfg = router_config([p.address], [d.address])
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, source=str(tiny_model_dir),
                                                             cache_dir=str(tmp_path / "models")))
    path = tmp_path / "router.yaml"
    dump_config(cfg, path)
    port, metrics_port = free_port(), free_port()
    with open(tmp_path / "router.log", "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "router", "--config", str(path), "--set", f"router.port={port}",
                                 "--set", f"router.metrics_port={metrics_port}"], cwd=ROOT, env=dict(os.environ),
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_port(port, 60, proc)
        wait_for_port(metrics_port, 10, proc)
        body = {"input_ids": list(range(1, 40)), "sampling_params": {"max_new_tokens": 2}}
        assert httpx.post(f"http://127.0.0.1:{port}/generate", json=body, timeout=30).status_code == 200
        scraped = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10)
        assert scraped.status_code == 200
        assert 'pdorch_router_requests_total{route="/generate",status="200"} 1.0' in scraped.text
        assert httpx.head(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).status_code == 200
        # the API is not on the metrics port; /metrics stays on the API port too
        other = httpx.post(f"http://127.0.0.1:{metrics_port}/generate", json=body, timeout=10)
        assert other.status_code == 404 and "serves GET /metrics only" in other.json()["error"]["message"]
        assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).status_code == 200
    finally:
        stop_process(proc)
    same = subprocess.run([sys.executable, "-m", "router", "--config", str(path), "--set", f"router.port={port}",
                           "--set", f"router.metrics_port={port}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False)
    assert same.returncode == 2 and "router.metrics_port and router.port are both" in same.stderr
