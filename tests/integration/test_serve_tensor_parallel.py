"""`pdorch serve --prefill-tp 2 --decode-tp 2` with the tiny model: each worker runs as a group of two
rank processes, the router reports their TP size, and a killed rank takes its worker down, which
serve restarts as a whole group while the cluster goes on serving.

Real children (mooncake_master, the workers and their follower ranks, the router) started by the
`pdorch` command on free ports; stopped by PID.
"""

from __future__ import annotations

import os
import signal

import httpx

from pdorch.child_process import pid_alive
from pdorch.local_stack.processes import free_port
from pdorch.ports import free_port_run
from tests.integration.test_serve import children_of, pdorch_command
from tests.integration.test_serve_supervision import serve_env, serve_process, wait_for, wait_serve_ready


def followers_of(pid: int) -> dict[int, str]:
    return {p: cmd for p, cmd in children_of(pid).items() if "pdorch.worker.tp_follower" in cmd}


def test_tp_workers_serve_report_their_size_and_restart_as_a_group(tmp_path, tiny_model_dir):
    router_port = free_port()
    sets = [f"store.master_address=127.0.0.1:{free_port()}",
            f"store.metadata_server=http://127.0.0.1:{free_port()}/metadata",
            f"store.master_metrics_port={free_port()}", "store.global_segment_size_mb=32",
            f"prefill.port={free_port_run(1)}", f"prefill.metrics_port={free_port()}",
            f"decode.port={free_port()}", f"decode.metrics_port={free_port()}", f"router.port={router_port}",
            f"model.source={tiny_model_dir}", f"model.cache_dir={tmp_path / 'models'}", "model.torch_threads=1",
            "router.health_check_interval_s=0.5", "router.circuit_breaker_cooldown_s=1", "grpc.token=tok-tp-4b1c"]
    argv = pdorch_command() + ["serve", "--prefill-tp", "2", "--decode-tp", "2", "--log-dir", str(tmp_path / "logs")]
    argv += [a for s in sets for a in ("--set", s)]
    url = f"http://127.0.0.1:{router_port}"
    out_path = tmp_path / "serve.out"
    body = {"input_ids": [5, 6, 7, 8] * 10, "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    with serve_process(argv, out_path, serve_env(), stop_timeout_s=30) as (proc, seen):
        wait_serve_ready(proc, out_path)
        kids = children_of(proc.pid)
        seen |= set(kids)
        workers = {cmd.split(" -m ")[1].split()[0]: pid for pid, cmd in kids.items() if "_node" in cmd}
        assert set(workers) == {"prefill_node", "decode_node"}, kids
        for pid in workers.values():  # one follower rank each, its argv free of the token
            followers = followers_of(pid)
            seen |= set(followers)
            assert len(followers) == 1 and all("tok-tp" not in c for c in followers.values()), followers
        first = httpx.post(url + "/generate", json=body, timeout=60)
        assert first.status_code == 200, first.text
        info = {w["role"]: w["info"] for w in httpx.get(url + "/workers", timeout=30).json()["workers"]}
        assert info["prefill"]["tp_size"] == info["decode"]["tp_size"] == 2, info

        old_prefill = workers["prefill_node"]
        os.kill(next(iter(followers_of(old_prefill))), signal.SIGKILL)
        wait_for(lambda: not pid_alive(old_prefill), 30,
                 "the prefill worker to exit after its rank died")

        def restarted() -> bool:
            new = [p for p, c in children_of(proc.pid).items() if "-m prefill_node" in c and p != old_prefill]
            seen.update(new)
            return bool(new) and len(followers_of(new[0])) == 1

        wait_for(restarted, 120, "serve to restart the prefill worker with its follower")
        again = wait_for(lambda: (r := httpx.post(url + "/generate", json=body, timeout=60)).status_code == 200
                         and r, 120, "a request served by the restarted group")
        assert again.json()["output_ids"] == first.json()["output_ids"]
        assert "restart" in out_path.read_text(errors="replace").lower()
