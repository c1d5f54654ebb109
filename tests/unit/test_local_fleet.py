"""LocalFleet (pdorch/local_fleet.py) with stand-in worker processes: a small script started in place
of `python -m {role}_node` that listens on the port its `--set {role}.port=` names and, on SIGTERM,
exits after STANDIN_DRAIN_S (or never, with STANDIN_HANG). Real processes, real signals, no model."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from pdorch import local_fleet
from pdorch.child_process import pid_alive
from pdorch.config_loader import default_config_path, load_config
from pdorch.launch_plan import child_base
from pdorch.local_fleet import LocalFleet
from pdorch.ports import port_answers

STANDIN = r'''
import faulthandler, os, signal, socket, sys, time
faulthandler.register(signal.SIGUSR2, all_threads=True)  # as a real worker does (pdorch/worker/main.py)
sets = dict(a.split("=", 1) for a in sys.argv if "=" in a)
role = sys.argv[sys.argv.index("-m") + 1].split("_")[0]
if os.environ.get("STANDIN_DIE_AT_START") == role:
    sys.exit(3)
stop = []
# NOTE: the handler before the port answers: the fleet counts a worker up once it does, and a SIGTERM in between
# killed the stand-in (exit -15, once in a whole-suite run two test files at a time)
signal.signal(signal.SIGTERM, lambda *_: stop.append(time.monotonic()))
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sets[role + ".port"]))); s.listen()
while not stop or os.environ.get("STANDIN_HANG"):
    time.sleep(0.02)
time.sleep(float(os.environ.get("STANDIN_DRAIN_S", "0")))
'''


@pytest.fixture
def fleet(tmp_path, monkeypatch):
    script = tmp_path / "standin.py"
    script.write_text(STANDIN)
    python = tmp_path / "python"  # what the fleet runs as `python -m {role}_node ...`
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {script} \"$@\"\n")
    python.chmod(0o755)
    monkeypatch.setattr(local_fleet, "drain_budget_s", lambda cfg, role: 0.5)
    monkeypatch.setattr(local_fleet, "KILL_MARGIN_S", 0.5)
    monkeypatch.setattr(local_fleet, "RESTART_BACKOFF_S", 0.2)
    cfg = load_config(default_config_path(), {"discovery.mode": "etcd", "prefill.metrics_port": "0",
                                               "decode.metrics_port": "0"}, environ={})
    said: list[str] = []
    f = LocalFleet(cfg, child_base(str(default_config_path()), ("discovery.mode=etcd",)), tmp_path, 1,
                   python=str(python), say=said.append)
    f.said = said
    yield f
    f.stop(5.0)


def test_scales_up_and_down_draining_the_newest_first(fleet, monkeypatch):
    monkeypatch.setenv("STANDIN_DRAIN_S", "0.3")
    fleet.apply({"prefill": 2, "decode": 1})
    fleet.converge(20)
    assert fleet.current() == {"prefill": 2, "decode": 1}
    prefill = [w for w in fleet.workers if w.role == "prefill"]
    assert [w.spec.name for w in prefill] == ["prefill-0", "prefill-1"]
    assert all(port_answers("127.0.0.1", w.spec.ports[0][1]) for w in fleet.workers)
    assert len({w.spec.ports[0][1] for w in fleet.workers}) == 3  # free ports, one each
    assert "--set" in prefill[0].spec.argv and "discovery.mode=etcd" in prefill[0].spec.argv

    fleet.apply({"prefill": 1})
    fleet.tick()
    newest = prefill[1]
    assert newest.draining and fleet.current() == {"prefill": 1, "decode": 1}  # draining ones not counted
    assert newest.child.running()  # SIGTERMed, still draining (0.3 s)
    fleet.converge(10)
    assert newest not in fleet.workers and not pid_alive(newest.child.pid)
    assert newest.child.exit_code() == 0  # drained and exited by itself, not killed
    assert [w.spec.name for w in fleet.workers if w.role == "prefill"] == ["prefill-0"]
    assert any("prefill-1 drained and exited (0)" in line for line in fleet.said)


def test_a_drain_that_hangs_is_killed_past_its_budget(fleet, monkeypatch):
    monkeypatch.setenv("STANDIN_HANG", "1")
    fleet.apply({"prefill": 1, "decode": 1})
    fleet.converge(20)
    decode = next(w for w in fleet.workers if w.role == "decode")
    t0 = time.monotonic()
    fleet.apply({"decode": 0})
    fleet.converge(10)
    assert 0.9 <= time.monotonic() - t0 < 5  # budget 0.5 s + margin 0.5 s, then SIGKILL
    assert decode.child.exit_code() == -signal.SIGKILL
    assert fleet.current() == {"prefill": 1, "decode": 0}
    assert "most recent call first" in decode.child.log_tail(40)  # its stacks, written before the SIGKILL


def test_a_worker_that_dies_unasked_is_replaced_with_backoff(fleet, monkeypatch):
    fleet.apply({"prefill": 1, "decode": 1})
    fleet.converge(20)
    first = next(w for w in fleet.workers if w.role == "decode")
    os.kill(first.child.pid, signal.SIGKILL)
    died = []
    deadline = time.monotonic() + 10
    while not died and time.monotonic() < deadline:
        died = fleet.tick()
        time.sleep(0.05)
    assert [w.spec.name for w in died] == ["decode-0"]
    assert fleet.current() == {"prefill": 1, "decode": 0}  # not before the backoff
    fleet.converge(10)
    assert [w.spec.name for w in fleet.workers if w.role == "decode"] == ["decode-1"]


def test_refuses_unknown_roles_negative_counts_and_static_discovery(fleet, tmp_path):
    with pytest.raises(ValueError, match="roles"):
        fleet.apply({"router": 2})
    with pytest.raises(ValueError, match="counts >= 0"):
        fleet.apply({"decode": -1})
    with pytest.raises(ValueError, match="discovery.mode etcd"):
        LocalFleet(load_config(default_config_path(), environ={}), (), tmp_path, 1)
