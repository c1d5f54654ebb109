"""`pdorch serve` end to end: the real mooncake_master, workers and router as its children.

Run as a user would: the `pdorch` console script in a subprocess, on free ports, with the real
SmolLM2 model; stopped by PID.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from pdorch.child_process import pid_alive, proc_stat
from pdorch.launcher import port_in_use
from pdorch.local_stack.processes import free_port, stop_process

pytestmark = pytest.mark.slow

READY_TIMEOUT_S = 300


def pdorch_command() -> list[str]:
    script = Path(sys.executable).parent / "pdorch"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "pdorch.cli"]


def children_of(pid: int) -> dict[int, str]:
    """{child pid: command line} of the live direct children of `pid`."""
    out = {}
    for entry in os.listdir("/proc"):
        fields = proc_stat(int(entry)) if entry.isdigit() else None
        if fields is None or int(fields[1]) != pid or not pid_alive(int(entry)):
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                out[int(entry)] = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
    return out


class Serve:
    """One `pdorch serve` subprocess on free ports; output in a file."""

    def __init__(self, tmp_path: Path, smollm2_dir: Path, extra: tuple[str, ...] = ()):
        self.ports = {k: free_port() for k in ("master", "metadata", "master_metrics", "prefill",
                                               "prefill_metrics", "decode", "decode_metrics", "router")}
        p = self.ports
        sets = [f"store.master_address=127.0.0.1:{p['master']}",
                f"store.metadata_server=http://127.0.0.1:{p['metadata']}/metadata",
                f"store.master_metrics_port={p['master_metrics']}", "store.global_segment_size_mb=64",
                f"prefill.port={p['prefill']}", f"prefill.metrics_port={p['prefill_metrics']}",
                f"decode.port={p['decode']}", f"decode.metrics_port={p['decode_metrics']}",
                f"router.port={p['router']}", f"model.cache_dir={smollm2_dir.parent}",
                "model.torch_threads=1"]
        self.url = f"http://127.0.0.1:{p['router']}"
        self.log_dir = tmp_path / "logs"
        self.out_path = tmp_path / "serve.out"
        argv = pdorch_command() + ["serve", "--log-dir", str(self.log_dir), *extra]
        argv += [a for s in sets for a in ("--set", s)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PDORCH_")}
        with open(self.out_path, "wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, start_new_session=True)

    def output(self) -> str:
        return self.out_path.read_text(errors="replace")

    def wait_ready(self) -> dict[int, str]:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while "pdorch is ready at" not in self.output():
            if self.proc.poll() is not None:
                pytest.fail(f"pdorch serve exited with {self.proc.returncode} before ready:\n{self.output()}")
            if time.monotonic() > deadline:
                pytest.fail(f"pdorch serve not ready within {READY_TIMEOUT_S} s:\n{self.output()}")
            time.sleep(0.5)
        return children_of(self.proc.pid)

    def stop(self) -> None:
        stop_process(self.proc, timeout_s=30)


@pytest.fixture
def serve(tmp_path, smollm2_dir):
    """Factory: serve(*extra pdorch serve flags) -> a started Serve; stopped at teardown."""
    if shutil.which("mooncake_master", path=str(Path(sys.executable).parent)) is None \
            and shutil.which("mooncake_master") is None:
        pytest.fail("mooncake_master is not installed (make setup installs it)")
    started: list[Serve] = []

    def start(*extra: str) -> Serve:
        started.append(Serve(tmp_path, smollm2_dir, extra))
        return started[-1]

    yield start
    for s in started:
        pids = children_of(s.proc.pid) if s.proc.poll() is None else {}
        s.stop()
        for pid in pids:  # NOTE: only if the test failed midway: never leave a cluster running
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_serve_answers_chat_and_stops_cleanly_on_sigterm(serve):
    serve = serve()
    kids = serve.wait_ready()
    out = serve.output()
    assert f"curl -s {serve.url}/v1/chat/completions" in out and f"Logs: {serve.log_dir}" in out
    roles = sorted(next(r for r in ("mooncake_master", "prefill_node", "decode_node", "router") if r in cmd)
                   for cmd in kids.values())
    assert roles == ["decode_node", "mooncake_master", "prefill_node", "router"], kids

    r = httpx.post(f"{serve.url}/v1/chat/completions", timeout=120, json={
        "model": "SmolLM2-135M-Instruct", "max_tokens": 24, "temperature": 0,
        "messages": [{"role": "user", "content": "What is the capital of France?"}]})
    assert r.status_code == 200, r.text
    answer = r.json()["choices"][0]["message"]["content"]
    assert "Paris" in answer, answer

    os.kill(serve.proc.pid, signal.SIGTERM)
    assert serve.proc.wait(timeout=60) == 0, serve.output()
    assert "SIGTERM received, stopping" in serve.output()
    assert "stopped 4 processes;" in serve.output()  # each stopped on SIGTERM, none needed SIGKILL
    assert not [pid for pid in kids if pid_alive(pid)]
    assert not [p for p in serve.ports.values() if port_in_use("127.0.0.1", p)]


def test_with_exit_on_failure_a_killed_worker_makes_serve_exit_nonzero_and_stop_the_rest(serve):
    serve = serve("--exit-on-failure")
    kids = serve.wait_ready()
    decode_pid = next(pid for pid, cmd in kids.items() if "decode_node" in cmd)
    os.kill(decode_pid, signal.SIGKILL)
    code = serve.proc.wait(timeout=60)
    out = serve.output()
    assert code == 1, out
    assert f"decode-0 (pid {decode_pid}) was killed by SIGKILL; stopping the others" in out
    assert f"Last lines of {serve.log_dir / 'decode-0.log'}:" in out
    assert not [pid for pid in kids if pid_alive(pid)]
    assert not [p for p in serve.ports.values() if port_in_use("127.0.0.1", p)]
