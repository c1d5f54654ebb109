"""`pdorch serve --masters 2` against a real etcd, with the tiny model: two mooncake_masters in HA
mode, one leading; `pdorch status --json` names both with their pids; the leader SIGKILLed: another
master leads (the standby, or the killed one restarted by serve: both are candidates), requests keep
succeeding, and both masters are back with one leading.

Real children (2 masters, a prefill and a decode worker, the router) started by the `pdorch`
command on free ports; stopped by PID.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess

import httpx
import pytest

from pdorch.child_process import pid_alive
from pdorch.local_stack.processes import free_port, stop_process
from pdorch.local_stack.router import start_etcd
from pdorch.ports import free_port_run
from tests.integration.test_serve import children_of, pdorch_command
from tests.integration.test_serve_supervision import serve_env, serve_process, wait_for, wait_serve_ready

LEAD_TIMEOUT_S = 40


@pytest.fixture
def serve(tmp_path, tiny_model_dir):
    etcd = start_etcd(tmp_path)
    address = f"etcd://{etcd.endpoint}"
    sets = [f"store.master_address={address}", f"store.metadata_server={address}",
            f"store.master_rpc_port={free_port_run(2)}", f"store.master_metrics_port={free_port_run(2)}",
            "store.global_segment_size_mb=32", "store.reconnect_interval_s=0.5",
            f"prefill.port={free_port()}", f"prefill.metrics_port={free_port()}",
            f"decode.port={free_port()}", f"decode.metrics_port={free_port()}", f"router.port={free_port()}",
            f"model.source={tiny_model_dir}", f"model.cache_dir={tmp_path / 'models'}", "model.torch_threads=1",
            "router.health_check_interval_s=0.5"]
    flags = [a for s in sets for a in ("--set", s)]
    out_path = tmp_path / "serve.out"
    argv = pdorch_command() + ["serve", "--masters", "2", "--log-dir", str(tmp_path / "logs")] + flags
    try:
        with serve_process(argv, out_path, serve_env(), stop_timeout_s=60) as (proc, seen):
            yield proc, flags, out_path, seen, serve_env()
    finally:
        stop_process(etcd.proc)

def test_serve_runs_two_ha_masters_and_restarts_a_killed_leader(serve):
    proc, flags, out_path, seen, env = serve
    url = "http://127.0.0.1:" + next(s.split("=")[1] for s in flags if s.startswith("router.port="))

    def output() -> str:
        return out_path.read_text(errors="replace")

    def masters() -> list[dict]:
        r = subprocess.run(pdorch_command() + ["status", "--json", "--url", url] + flags, capture_output=True,
                           text=True, timeout=60, env=env, check=False)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)["store"]["masters"]

    def generate() -> int:
        return httpx.post(url + "/generate", timeout=60,
                          json={"input_ids": [5, 6, 7, 8], "sampling_params": {"max_new_tokens": 4}}).status_code

    wait_serve_ready(proc, out_path)
    kids = children_of(proc.pid)
    seen |= set(kids)
    assert len(kids) == 5, kids  # master-0, master-1, prefill-0, decode-0, router
    assert "master-0 metrics :" in output() and "master-1 metrics :" in output()
    shown = masters()
    assert len(shown) == 2 and [m["leader"] for m in shown].count(True) == 1, shown
    assert {m["pid"] for m in shown} <= set(kids), (shown, kids)
    assert generate() == 200

    leader = next(m for m in shown if m["leader"])
    os.kill(leader["pid"], signal.SIGKILL)
    # Either the standby or the killed master, restarted by serve 1 s later, wins the election: both
    # are candidates once the dead leader's 5 s etcd lease expires.
    wait_for(lambda: any(m["leader"] and m.get("pid") not in (None, leader["pid"]) for m in masters()),
             LEAD_TIMEOUT_S, "another master to lead")
    assert [generate() for _ in range(3)] == [200] * 3
    wait_for(lambda: "restarted" in output(), 30, "serve to restart the killed master")
    back = wait_for(lambda: [m for m in masters() if m["address"] == leader["address"] and "pid" in m], 30,
                    "the killed master back")
    assert back[0]["pid"] != leader["pid"], back
    now = masters()
    assert len(now) == 2 and [m["leader"] for m in now].count(True) == 1, now  # the other one stands by
    seen |= set(children_of(proc.pid))

    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=90) == 0, output()
    assert not [pid for pid in seen if pid_alive(pid)]
