"""`pdorch serve` as a supervisor, with the tiny model: a killed worker is restarted while the
cluster keeps serving, and API keys reach only the router (by env), never an argv or a log.

Real children (mooncake_master, 2 prefill + 1 decode workers, router) started by the `pdorch`
command on free ports; stopped by PID.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from pdorch.child_process import pid_alive
from pdorch.local_stack.processes import free_port, stop_process
from pdorch.ports import free_port_run
from tests.integration.test_serve import children_of, pdorch_command

pytestmark = pytest.mark.slow

API_KEY = "sk-client-8f3a1c2e9b7d"
ADMIN_KEY = "sk-admin-5e6d4c3b2a19"
GRPC_TOKEN = "tok-grpc-0a9b8c7d6e5f"  # the workers check it, the router and decode workers send it
SECRETS = (API_KEY, ADMIN_KEY, GRPC_TOKEN)
READY_TIMEOUT_S = 240


def read_environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        items = [e.partition(b"=") for e in f.read().split(b"\0") if e]
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in items}


def prefill_port(cmd: str) -> int:
    """A prefill worker's gRPC port, from the launcher's own (last) --set prefill.port=."""
    return int(cmd.split("prefill.port=")[-1].split()[0])


def wait_for(cond, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def wait_serve_ready(proc: subprocess.Popen, out_path: Path, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Until `pdorch serve` (writing to out_path) says it is ready; fails at once if it exited."""
    def ready() -> bool:
        out = out_path.read_text(errors="replace")
        if proc.poll() is not None:
            pytest.fail(f"pdorch serve exited with {proc.returncode} before ready:\n{out}")
        return "pdorch is ready at" in out

    wait_for(ready, timeout_s, "pdorch serve to be ready")


@pytest.fixture
def cluster(tmp_path, tiny_model_dir):
    """`pdorch serve --prefill 2 --set router.api_key=... --set router.admin_key=... --set grpc.token=...`
    (tiny model)."""
    router_port = free_port()
    ports = [f"store.master_address=127.0.0.1:{free_port()}",
             f"store.metadata_server=http://127.0.0.1:{free_port()}/metadata",
             f"store.master_metrics_port={free_port()}", "store.global_segment_size_mb=32",
             f"prefill.port={free_port_run(2)}", f"prefill.metrics_port={free_port_run(2)}",
             f"decode.port={free_port()}", f"decode.metrics_port={free_port()}", f"router.port={router_port}"]
    sets = ports + [f"model.source={tiny_model_dir}", f"model.cache_dir={tmp_path / 'models'}",
                    "model.torch_threads=1", "router.health_check_interval_s=0.5",
                    "router.circuit_breaker_cooldown_s=1", f"router.api_key={API_KEY}",
                    f"router.admin_key={ADMIN_KEY}", f"grpc.token={GRPC_TOKEN}"]
    log_dir = tmp_path / "logs"
    out_path = tmp_path / "serve.out"
    argv = pdorch_command() + ["serve", "--prefill", "2", "--log-dir", str(log_dir)]
    argv += [a for s in sets for a in ("--set", s)]
    with serve_process(argv, out_path, serve_env(), stop_timeout_s=30) as (proc, seen):
        yield proc, f"http://127.0.0.1:{router_port}", log_dir, out_path, seen


def serve_env() -> dict[str, str]:
    """This environment without PDORCH_* variables (they would override the test's --set flags)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PDORCH_")}


@contextlib.contextmanager
def serve_process(argv: list[str], out_path: Path, env: dict[str, str], stop_timeout_s: float):
    """`pdorch serve` started with its output in out_path: (the process, the set of child pids the test
    saw). Stopped by PID at the end; any child the test saw still alive is then SIGKILLed."""
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
    seen: set[int] = set()
    try:
        yield proc, seen
    finally:
        seen |= set(children_of(proc.pid)) if proc.poll() is None else set()
        stop_process(proc, timeout_s=stop_timeout_s)
        for pid in seen:  # NOTE: only if the test failed midway: never leave a cluster running
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_killed_worker_is_restarted_while_serving_and_keys_stay_out_of_argv_and_logs(cluster):
    proc, url, log_dir, out_path, seen = cluster

    def output() -> str:
        return out_path.read_text(errors="replace")

    wait_serve_ready(proc, out_path)
    kids = children_of(proc.pid)
    seen |= set(kids)
    assert len(kids) == 5, kids  # master, prefill-0, prefill-1, decode-0, router
    client = {"Authorization": f"Bearer {API_KEY}"}
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}

    # Secrets: in no child's command line; each only in the environment of the children that use it.
    for pid, cmd in kids.items():
        assert not [s for s in SECRETS if s in cmd], cmd
        env = read_environ(pid)
        keys = {"PDORCH_ROUTER_API_KEY", "PDORCH_ROUTER_ADMIN_KEY"} & set(env)
        if "-m router" in cmd:
            assert env["PDORCH_ROUTER_API_KEY"] == API_KEY and env["PDORCH_ROUTER_ADMIN_KEY"] == ADMIN_KEY
            assert env["PDORCH_GRPC_TOKEN"] == GRPC_TOKEN
        elif "_node" in cmd:
            assert not keys and env["PDORCH_GRPC_TOKEN"] == GRPC_TOKEN, cmd
        else:  # mooncake_master
            assert not keys and "PDORCH_GRPC_TOKEN" not in env, cmd
    assert httpx.post(url + "/generate", json={"input_ids": [1, 2, 3]}, timeout=30).status_code == 401

    def generate() -> int:
        return httpx.post(url + "/generate", headers=client, timeout=60,
                          json={"input_ids": [5, 6, 7, 8], "sampling_params": {"max_new_tokens": 4}}).status_code

    assert generate() == 200

    # kill -9 one prefill worker: requests keep succeeding (the router retries on prefill-0).
    victim_port = max(prefill_port(cmd) for cmd in kids.values() if "prefill_node" in cmd)  # prefill-1
    victim = next(pid for pid, cmd in kids.items() if "prefill_node" in cmd and prefill_port(cmd) == victim_port)
    os.kill(victim, signal.SIGKILL)
    statuses = [generate() for _ in range(6)]
    assert statuses == [200] * 6, statuses

    # pdorch serve restarts it; the router finds it healthy again on the same address.
    wait_for(lambda: "prefill-1 restarted" in output(), 30, "the restart of prefill-1")
    assert f"prefill-1 (pid {victim}) was killed by SIGKILL; restarting it in 1 s" in output()
    restarted = wait_for(lambda: [p for p, c in children_of(proc.pid).items() if p not in kids], 10,
                         "the new prefill-1 process")
    seen |= set(restarted)
    address = f"127.0.0.1:{victim_port}"

    def healthy_again() -> bool:
        workers = httpx.get(url + "/workers", headers=admin, timeout=10).json()["workers"]
        mine = [w for w in workers if w["address"] == address]
        return bool(mine) and mine[0]["healthy"] and mine[0]["circuit"] == "closed"

    wait_for(healthy_again, 120, f"the router to see prefill-1 at {address} healthy again")
    assert [generate() for _ in range(4)] == [200] * 4
    assert proc.poll() is None  # still serving

    # Keys appear in no log and not in /metrics.
    metrics = httpx.get(url + "/metrics", timeout=10).text
    assert not [s for s in SECRETS if s in metrics]
    logs = {p.name: p.read_text(errors="replace") for p in Path(log_dir).glob("*.log")}
    assert {"router.log", "prefill-0.log", "prefill-1.log", "decode-0.log"} <= set(logs)
    for name, text in logs.items():
        assert not [s for s in SECRETS if s in text], name
    assert "router.api_key" not in logs["router.log"]  # not even redacted: never on its argv

    # SIGTERM: everything stops cleanly, no orphans, ports free.
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, output()
    assert "stopped 5 processes;" in output(), output()  # none needed SIGKILL
    assert not [pid for pid in seen if pid_alive(pid)]

