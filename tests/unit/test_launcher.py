"""pdorch.launcher / child_process supervision, with stand-in components (tiny listeners).

The real master, workers and router are exercised by tests/integration/test_serve.py; here the
children are small Python processes so the start / watch / stop logic is tested on its own.
"""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from pdorch.child_process import Child, pid_alive, stop_children
from pdorch.config import Config
from pdorch.launch_plan import ChildSpec, LaunchPlan
from pdorch.launcher import LocalCluster, ServeOptions, curl_example, port_in_use
from pdorch.local_stack.processes import free_port

FAKE = r"""
import http.server, os, signal, subprocess, sys, time
port, mode, exit_after = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if mode == "parent":
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # a grandchild
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health_generate" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
srv = http.server.HTTPServer(("127.0.0.1", port), H)
srv.timeout = 0.1
print(f"fake listening on {port}", flush=True)
t0 = time.monotonic()
while not exit_after or time.monotonic() - t0 < exit_after:
    srv.handle_request()
print("fake: something broke, exiting with 3", flush=True)
sys.exit(3)
"""


def spec(tmp_path, name, role, port, mode="plain", exit_after=0.0) -> ChildSpec:
    script = tmp_path / "fake.py"
    script.write_text(FAKE)
    return ChildSpec(name, role, (sys.executable, str(script), str(port), mode, str(exit_after)),
                     "127.0.0.1", ((f"{role}.port", port),))


def cluster(tmp_path, children, startup_timeout_s=30.0, **options):
    router_port = next(c.ports[0][1] for c in children if c.role == "router")
    plan = LaunchPlan(Config(), tuple(children), 1, f"http://127.0.0.1:{router_port}")
    opts = ServeOptions(log_dir=str(tmp_path / "logs"), startup_timeout_s=startup_timeout_s,
                        stop_timeout_s=2.0, prepare=False, **options)
    return LocalCluster(Config(), "/unused.yaml", (), opts, io.StringIO(), plan=plan)


def gone(pid: int) -> bool:
    return not pid_alive(pid)


def run_then_sigterm(lc: LocalCluster, until) -> tuple[int, list[int]]:
    """lc.run() until `until(output)` holds (30 s at most), then SIGTERM: (exit code, child pids then)."""
    pids: list[int] = []

    def stop_when():
        deadline = time.monotonic() + 30
        while not until(lc.out.getvalue()) and time.monotonic() < deadline:
            time.sleep(0.05)
        pids.extend(c.pid for c in lc.children)
        os.kill(os.getpid(), signal.SIGTERM)  # handled by LocalCluster (main thread): sets its flag

    t = threading.Thread(target=stop_when)
    t.start()
    code = lc.run()
    t.join(10)
    return code, pids


def test_ready_then_sigterm_stops_every_child_and_frees_ports(tmp_path):
    ports = [free_port() for _ in range(3)]
    lc = cluster(tmp_path, [spec(tmp_path, "prefill-0", "prefill", ports[0]),
                            spec(tmp_path, "decode-0", "decode", ports[1]),
                            spec(tmp_path, "router", "router", ports[2])])
    code, pids = run_then_sigterm(lc, lambda out: "is ready at" in out)
    out = lc.out.getvalue()
    assert code == 0, out
    assert f"curl -s http://127.0.0.1:{ports[2]}/v1/chat/completions" in out
    assert "SIGTERM received, stopping" in out and "stopped 3 processes" in out
    assert len(pids) == 3 and all(gone(pid) for pid in pids)
    assert not any(port_in_use("127.0.0.1", p) for p in ports)
    assert (tmp_path / "logs" / "decode-0.log").read_text().count(f"fake listening on {ports[1]}") == 1
    assert signal.getsignal(signal.SIGTERM) is not lc._on_signal  # handlers restored


def test_with_exit_on_failure_a_dying_child_stops_the_rest_and_shows_its_log(tmp_path):
    ports = [free_port() for _ in range(3)]
    lc = cluster(tmp_path, [spec(tmp_path, "prefill-0", "prefill", ports[0]),
                            spec(tmp_path, "decode-0", "decode", ports[1], exit_after=2.0),
                            spec(tmp_path, "router", "router", ports[2])], restart=False)
    assert lc.run() == 1
    out = lc.out.getvalue()
    assert "decode-0" in out and "exited with 3; stopping the others" in out
    assert "| fake: something broke, exiting with 3" in out
    assert all(not c.running() and gone(c.pid) for c in lc.children)


def test_a_child_dying_after_ready_is_restarted_with_backoff_then_sigterm_stops_all(tmp_path):
    ports = [free_port() for _ in range(3)]
    lc = cluster(tmp_path, [spec(tmp_path, "prefill-0", "prefill", ports[0]),
                            spec(tmp_path, "decode-0", "decode", ports[1], exit_after=1.0),
                            spec(tmp_path, "router", "router", ports[2])],
                 restart_backoff_s=0.2, restart_backoff_max_s=0.4)
    code, pids = run_then_sigterm(lc, lambda out: out.count("decode-0 restarted") >= 3)
    out = lc.out.getvalue()
    assert code == 0, out
    # dies after 1 s each time, quicker than restart_reset_s: 0.2 s, then 0.4 s (the cap), 0.4 s
    assert "decode-0 (pid" in out and "exited with 3; restarting it in 0.2 s (failure 1 in a row)" in out
    assert "in 0.4 s (failure 2 in a row)" in out and "in 0.4 s (failure 3 in a row)" in out
    assert "| fake: something broke, exiting with 3" in out
    assert lc.children[1].name == "decode-0" and lc.children[1].starts >= 4
    assert "stopping the others" not in out
    assert "SIGTERM received, stopping" in out and "stopped 3 processes" in out
    assert all(gone(pid) for pid in pids)
    assert not any(port_in_use("127.0.0.1", p) for p in ports)
    # the other children kept running all along: started once
    assert [c.starts for c in lc.children if c.name != "decode-0"] == [1, 1]
    # every start that died had listened first; the last one may be stopped before it listens
    assert (tmp_path / "logs" / "decode-0.log").read_text().count(f"fake listening on {ports[1]}") >= 3


def test_startup_deadline(tmp_path):
    ports = [free_port(), free_port()]
    never = ChildSpec("prefill-0", "prefill", (sys.executable, "-c", "import time; time.sleep(60)"),
                      "127.0.0.1", (("prefill.port", ports[0]),))
    lc = cluster(tmp_path, [never, spec(tmp_path, "router", "router", ports[1])], startup_timeout_s=1.0)
    t0 = time.monotonic()
    assert lc.run() == 1
    assert time.monotonic() - t0 < 10
    assert "not ready within 1 s" in lc.out.getvalue()
    assert all(gone(c.pid) for c in lc.children)


def test_port_in_use_is_refused_before_anything_starts(tmp_path):
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        lc = cluster(tmp_path, [spec(tmp_path, "router", "router", port)])
        assert lc.run() == 2
    assert f"ports already in use: {port} (router.port of router)" in lc.out.getvalue()
    assert lc.children == []


def test_stop_children_escalates_to_sigkill_and_reaches_grandchildren(tmp_path):
    stubborn = Child("stubborn", spec(tmp_path, "x", "x", free_port(), "stubborn").argv, tmp_path / "s.log")
    parent = Child("parent", spec(tmp_path, "y", "y", free_port(), "parent").argv, tmp_path / "p.log")
    for c in (stubborn, parent):
        c.start()
    deadline = time.monotonic() + 20
    # both listening: the stubborn one ignores SIGTERM and the parent has its grandchild by then
    while not all("fake listening" in c.log_tail() for c in (stubborn, parent)):
        assert time.monotonic() < deadline, "the fake children never listened"
        time.sleep(0.05)
    t0 = time.monotonic()
    killed = stop_children([stubborn, parent], timeout_s=1.0)
    assert killed == ["stubborn"]
    assert time.monotonic() - t0 < 5
    assert not stubborn.group_alive() and not parent.group_alive()  # the grandchild is gone too
    assert stubborn.exit_code() == -signal.SIGKILL


def test_child_dies_with_a_killed_parent(tmp_path):
    """PR_SET_PDEATHSIG: a SIGKILLed `pdorch serve` leaves no orphans."""
    code = ("import sys; from pdorch.child_process import Child; "
            "c = Child('s', [sys.executable, '-c', 'import time; time.sleep(60)'], sys.argv[1]); c.start(); "
            "print(c.pid, flush=True); import time; time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "c.log")], stdout=subprocess.PIPE,
                              text=True)
    try:
        child_pid = int(parent.stdout.readline())
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not gone(child_pid):
            time.sleep(0.05)
        assert gone(child_pid)
    finally:
        parent.kill()
        parent.wait(10)


def test_curl_example_mentions_the_key_only_by_env_var():
    text = curl_example("http://h:1", "M", with_api_key=True)
    assert '"model": "M"' in text and "$PDORCH_ROUTER_API_KEY" in text
    assert "Authorization" not in curl_example("http://h:1", "M", with_api_key=False)



def test_a_missing_executable_stops_what_started(tmp_path):
    ports = [free_port(), free_port()]
    missing = ChildSpec("decode-0", "decode", (str(tmp_path / "no-such-binary"),), "127.0.0.1",
                        (("decode.port", ports[1]),))
    lc = cluster(tmp_path, [spec(tmp_path, "prefill-0", "prefill", ports[0]), missing,
                            spec(tmp_path, "router", "router", free_port())])
    assert lc.run() == 1
    assert "cannot start decode-0" in lc.out.getvalue() and "No such file" in lc.out.getvalue()
    assert [c.name for c in lc.children] == ["prefill-0"] and gone(lc.children[0].pid)


def test_ha_masters_without_etcd_or_without_ha_are_refused_before_anything_starts(tmp_path):
    from pdorch.config_loader import default_config_path, load_config

    dead = f"etcd://127.0.0.1:{free_port()}"  # nothing listens there
    for overrides, masters, said in (
            ({"store.master_address": dead, "store.metadata_server": dead}, 2,
             "store.master_address: no etcd endpoint of etcd://127.0.0.1:"),
            ({}, 0, "--masters must be >= 1, got 0")):
        cfg = load_config(default_config_path(), overrides, environ={})
        opts = ServeOptions(log_dir=str(tmp_path / "logs"), prepare=False, num_masters=masters)
        lc = LocalCluster(cfg, "/unused.yaml", (), opts, io.StringIO())
        t0 = time.monotonic()
        assert lc.run() == 2, lc.out.getvalue()
        assert said in lc.out.getvalue() and lc.children == []
        assert time.monotonic() - t0 < 10  # one line, no wait for a leader that cannot be elected
