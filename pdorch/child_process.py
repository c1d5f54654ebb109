"""One child process of `pdorch serve`: its own process group, its own log file, stopped by PID.

NOTE: each child leads a new session (so a terminal's Ctrl-C reaches only `pdorch serve`, which
then stops the children in order) and asks the kernel for SIGTERM when its parent dies
(PR_SET_PDEATHSIG), so even a SIGKILLed `pdorch serve` leaves no orphans behind. The death signal is
set by util-linux's `setpriv --pdeathsig` in front of the command (it survives the exec), not by a
Popen preexec_fn: a preexec_fn runs Python between fork and exec, which is unsafe once other threads
run (`serve --autoscale`'s planner thread, a test's in-process router: a child aborted in
threading's fork hooks). Where setpriv is missing, the preexec_fn is the fallback.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from pdorch.launch_plan import redact_argv

_PR_SET_PDEATHSIG = 1
try:  # loaded once here: the hook below runs between fork and exec, no place for dlopen
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: the signal handlers of `pdorch serve` still stop children
    _PRCTL = None


def die_with_parent() -> None:  # runs in the child between fork and exec (a Popen preexec_fn)
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


_SETPRIV = shutil.which("setpriv")


def popen_dying_with_parent(argv: Sequence[str], **popen_kwargs) -> subprocess.Popen:
    """subprocess.Popen(argv, **popen_kwargs) for a child that gets SIGTERM when this process dies, returned
    once its death signal is set (through setpriv; else a preexec_fn)."""
    if _SETPRIV is None:
        return subprocess.Popen(list(argv), preexec_fn=die_with_parent, **popen_kwargs)  # noqa: PLW1509
    if shutil.which(argv[0]) is None:  # as Popen says it; setpriv's exec would fail inside the child
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv[0])
    proc = subprocess.Popen([_SETPRIV, "--pdeathsig", "TERM", "--", *argv], **popen_kwargs)
    _until_past_setpriv(proc)
    return proc


class Child:
    """A named child process writing stdout+stderr to `log_path`."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None):
        self.name = name
        self.argv = list(argv)
        self.log_path = Path(log_path)
        self.env = dict(env) if env is not None else None
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0  # time.monotonic() of the last start
        self.starts = 0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            log.write(f"$ {' '.join(redact_argv(self.argv))}\n".encode())  # NOTE: never a secret in a log
            log.flush()
            self.proc = popen_dying_with_parent(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, env=self.env, start_new_session=True)
        self.started_at = time.monotonic()
        self.starts += 1

    def exit_code(self) -> int | None:
        """None while running (or never started); the exit status once it ended (-N = signal N)."""
        return None if self.proc is None else self.proc.poll()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal_group(self, sig: int) -> None:
        """Send `sig` to the child's whole process group (it and anything it spawned)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def group_alive(self) -> bool:
        """True while any live process of the child's group exists (the leader may be gone already)."""
        if self.proc is None:
            return False
        self.proc.poll()  # reap the leader so its zombie does not count
        return _group_has_live_process(self.proc.pid)

    def log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 64 * 1024))
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def _until_past_setpriv(proc: subprocess.Popen, timeout_s: float = 2.0) -> None:
    """Until setpriv has set the death signal and exec'd the command (or the child is gone), at most
    `timeout_s`. NOTE: Popen returns once setpriv itself runs, before its prctl: a parent killed in
    that window (seen once in a whole-suite run) left the child behind. Milliseconds per start."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with open(f"/proc/{proc.pid}/comm") as f:
                if f.read().strip() != "setpriv":
                    return
        except OSError:  # gone already, or no procfs
            return
        time.sleep(0.001)


def _group_has_live_process(pgid: int) -> bool:
    """Any non-zombie process in process group `pgid`?

    NOTE: killpg(pgid, 0) also succeeds for zombies: an orphaned grandchild that exited stays a
    zombie until PID 1 reaps it, and some container init processes are slow to. /proc tells them apart.
    """
    try:
        entries = os.listdir("/proc")
    except OSError:  # no procfs: fall back to the signal probe
        try:
            os.killpg(pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False
    for entry in entries:
        fields = proc_stat(int(entry)) if entry.isdigit() else None
        if fields is not None and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def proc_stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat fields after "pid (comm)": [state, ppid, pgrp, ...]; None if no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def pid_alive(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan's zombie may wait long for PID 1)."""
    fields = proc_stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def stop_children(children: Sequence[Child], timeout_s: float = 10.0) -> list[str]:
    """SIGTERM every group, wait up to timeout_s, SIGKILL what is left; names of the SIGKILLed."""
    for child in children:
        child.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(c.group_alive() for c in children):
        time.sleep(0.05)
    killed = [c.name for c in children if c.group_alive()]
    for child in children:
        if child.group_alive():
            child.signal_group(signal.SIGKILL)
    for child in children:
        if child.proc is not None:
            try:
                child.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:  # NOTE: unkillable (D state); nothing more we can do
                pass
    return killed
