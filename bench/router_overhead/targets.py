"""The processes of one phase of the router-overhead study: the stand-in workers (gRPC P and D,
and an HTTP one for sglang-router), the pdorch router, the control (floor.py) and, if installed,
sglang-router; each in its own process group, logged to the phase's folder, stopped by PID. The
comparison and the TTFT path study start the same targets, so they measure the same thing.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from pdorch.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} not ready within {timeout_s}s")


def wait_port(port: int, timeout_s: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"port {port} not open within {timeout_s}s")


class Procs:
    """Child processes of one phase, each in its own process group, stopped by PID."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, args: list[str]) -> subprocess.Popen:
        with open(self.log_dir / f"{name}.log", "ab") as log:
            p = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                 env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self.procs.append(p)
        return p

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait(timeout=10)
        self.procs.clear()


def start_targets(procs: Procs, tmp: Path, token_delay_s: float, model_dir: Path, floor: bool = True,
                  sglang: bool = True) -> dict:
    """Stand-ins, our router and (if installed and `sglang`) sglang-router; returns their URLs."""
    py = sys.executable
    p_port, d_port, h_port, r_port = free_port(), free_port(), free_port(), free_port()
    d = procs.start("standin_decode", [py, "-m", "pdorch.local_stack.standin", "--role", "decode", "--port", str(d_port),
                                       "--token-delay-s", str(token_delay_s)])
    p = procs.start("standin_prefill", [py, "-m", "pdorch.local_stack.standin", "--role", "prefill", "--port", str(p_port)])
    h = procs.start("standin_http", [py, "-m", "bench.router_overhead.http_standin", "--port", str(h_port),
                                     "--token-delay-ms", str(token_delay_s * 1000)])
    cfg = tmp / "router.yaml"
    cfg.write_text(json.dumps({
        "model": {"source": str(model_dir), "cache_dir": str(tmp / "models"), "page_size": 16},
        "router": {"host": "127.0.0.1", "port": r_port, "max_queued_requests": 4096},
        "discovery": {"mode": "static", "prefill": [f"127.0.0.1:{p_port}"], "decode": [f"127.0.0.1:{d_port}"]}}))
    r = procs.start("pdorch_router", [py, "-m", "router", "--config", str(cfg), "--log-level", "warning"])
    for port, proc in ((d_port, d), (p_port, p), (h_port, h)):
        wait_port(port, 30, proc)
    wait_http(f"http://127.0.0.1:{r_port}/health", 60, r)
    urls = {"ours": f"http://127.0.0.1:{r_port}", "ours_direct": f"grpc://127.0.0.1:{d_port}",
            "sglang_direct": f"http://127.0.0.1:{h_port}", "sglang": None, "floor": None, "pids": {"ours": r.pid}}
    if floor:
        f_port = free_port()
        f = procs.start("python_floor", [py, "-m", "bench.router_overhead.floor", "--port", str(f_port),
                                         "--decode", f"127.0.0.1:{d_port}"])
        wait_port(f_port, 30, f)
        urls["floor"] = f"http://127.0.0.1:{f_port}"
        urls["pids"]["floor"] = f.pid
    if sglang and (shutil.which("sglang-router") or _has_module("sglang_router")):
        s_port = free_port()
        s = procs.start("sglang_router", [py, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                                          "--port", str(s_port), "--worker-urls", f"http://127.0.0.1:{h_port}",
                                          "--policy", "cache_aware", "--log-level", "warn",
                                          "--max-concurrent-requests", "4096"])
        wait_http(f"http://127.0.0.1:{s_port}/health", 60, s)
        urls["sglang"] = f"http://127.0.0.1:{s_port}"
        urls["pids"]["sglang"] = s.pid
    return urls


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None
