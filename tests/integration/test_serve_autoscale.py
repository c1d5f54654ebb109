"""`pdorch serve --autoscale --masters 2` with no etcd named anywhere, tiny model: one command starts a
local etcd first, two mooncake_masters in HA mode against it (one leads), the store-memory node (a
mooncake_client finding the leader through etcd) and the workers as a local fleet of pure store clients
registered through etcd discovery; requests succeed; SIGTERM stops every child, etcd last.

Real children started by the `pdorch` command on free ports; stopped by PID.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import httpx

from pdorch.child_process import pid_alive
from pdorch.local_stack.processes import free_port
from pdorch.ports import free_port_run
from tests.integration.test_serve import children_of, pdorch_command
from tests.integration.test_serve_supervision import serve_env, serve_process, wait_serve_ready

REPO = Path(__file__).resolve().parents[2]


def test_serve_autoscale_with_two_masters_starts_its_own_etcd_and_stops_it_last(tmp_path, tiny_model_dir):
    router_port = free_port()
    profile = tmp_path / "profile.json"  # --autoscale refuses to start without one; dry-run: it only reports
    profile.write_text(json.dumps({"version": 1, "model": "tiny", "device": "cpu", "created": "2026-01-01T00:00:00Z",
                                   "prefill": [{"prompt_tokens": 64, "tokens_per_s": 1000.0, "ttft_s": 0.1}],
                                   "decode": [{"batch": 1, "context_tokens": 64, "tokens_per_s": 50.0,
                                               "itl_s": 0.02}]}))
    sets = [f"planner.profile_path={profile}", "planner.metrics_port=0",f"store.master_rpc_port={free_port_run(2)}", f"store.master_metrics_port={free_port_run(2)}",
            "store.global_segment_size_mb=32", "store.memory_node_segment_mb=64", f"router.port={router_port}",
            f"model.source={tiny_model_dir}", f"model.cache_dir={tmp_path / 'models'}", "model.torch_threads=1",
            "router.health_check_interval_s=0.5", "prefill.drain_timeout_s=1", "decode.drain_timeout_s=1"]
    env = dict(serve_env(), PYTHONPATH=str(REPO))  # this checkout's pdorch, not the installed one
    out_path = tmp_path / "serve.out"
    argv = pdorch_command() + ["serve", "--autoscale", "--masters", "2", "--log-dir", str(tmp_path / "logs")]
    argv += [a for s in sets for a in ("--set", s)]
    url = f"http://127.0.0.1:{router_port}"
    with serve_process(argv, out_path, env, stop_timeout_s=60) as (proc, seen):
        wait_serve_ready(proc, out_path)
        out = out_path.read_text()
        kids = children_of(proc.pid)
        seen |= set(kids)
        etcd = [cmd for cmd in kids.values() if " --name pdorch-etcd " in cmd]
        assert len(etcd) == 1, kids
        endpoint = etcd[0].split("--listen-client-urls http://")[1].split()[0]
        assert (out.index("etcd ") < out.index("mooncake_master") < out.index("store-memory node")
                < out.index("fleet ready")), out
        masters = [cmd for cmd in kids.values() if "mooncake_master" in cmd]
        assert len(masters) == 2 and all(f"--etcd_endpoints={endpoint}" in m for m in masters), masters
        memory = [cmd for cmd in kids.values() if "mooncake_client" in cmd]
        assert len(memory) == 1 and f"--master_server_address=etcd://{endpoint}" in memory[0], memory
        # by module: every child's --set carries store.memory_node_segment_mb, "_node" alone matches the router too
        workers = [cmd for cmd in kids.values() if " -m prefill_node " in cmd or " -m decode_node " in cmd]
        assert len(workers) == 2 and all("discovery.mode=etcd" in w and f"discovery.etcd_endpoints={endpoint}" in w
                                         and "--set store.global_segment_size_mb=0" in w for w in workers), workers
        r = httpx.post(url + "/generate", timeout=60,
                       json={"input_ids": [5, 6, 7, 8], "sampling_params": {"max_new_tokens": 4}})
        assert r.status_code == 200, r.text
        status = subprocess.run(pdorch_command() + ["status", "--json", "--url", url], capture_output=True,
                                text=True, timeout=60, env=env, check=False)
        assert status.returncode == 0, status.stderr
        roles = sorted(w["role"] for w in json.loads(status.stdout)["workers"])
        assert roles == ["decode", "prefill"], status.stdout

        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=90) == 0, out_path.read_text()
        assert "stopped 7 processes" in out_path.read_text()  # etcd, 2 masters, store-memory, router + the fleet's 2
        assert not [pid for pid in seen if pid_alive(pid)]
