"""Free ports and child processes owned by a test: started on loopback, stopped by PID."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

from pdorch.ports import free_port

__all__ = ["free_port", "stop_process", "stop_processes", "wait_for_port"]  # free_port: re-exported, one import for stack code


def wait_for_port(port: int, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    """Wait until something listens on 127.0.0.1:port; fail fast if `proc` dies first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process {proc.args!r} exited with {proc.returncode} before port {port} opened")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(0.2)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listened on port {port} within {timeout_s}s")


def stop_process(proc: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """SIGTERM, wait, then SIGKILL: the process (and its group, when it leads one) is gone after this."""
    stop_processes([proc], timeout_s)


def stop_processes(procs: list[subprocess.Popen], timeout_s: float = 10.0) -> None:
    """stop_process for several at once: SIGTERM to all, then each waited for (SIGKILL past the
    deadline), so their shutdowns overlap instead of adding up."""
    signalled = [proc for proc in procs if _signal(proc, signal.SIGTERM)]
    deadline = time.monotonic() + timeout_s
    for proc in signalled:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal(proc, signal.SIGKILL)
            proc.wait(timeout=timeout_s)


def _signal(proc: subprocess.Popen, sig: int) -> bool:
    """Send `sig` to the process (to its group, when it leads one); False when it is already gone."""
    if proc.poll() is not None:
        return False
    try:
        pgid = os.getpgid(proc.pid)
        (os.killpg if pgid == proc.pid else os.kill)(pgid if pgid == proc.pid else proc.pid, sig)
        return True
    except ProcessLookupError:
        return False

