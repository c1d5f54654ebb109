"""router/http/listen.py: several sockets on one port share the connections; a taken port is a clear
error (also for `python -m router`), never a silent share."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from pdorch.local_stack.processes import free_port
from router.http.listen import PortInUse, listen_sockets


def test_connections_are_spread_over_the_sockets_of_one_port():
    port = free_port()
    sockets = listen_sockets("127.0.0.1", port, count=4)
    try:
        assert len(sockets) == 4 and {s.getsockname()[1] for s in sockets} == {port}
        for s in sockets:
            s.listen(64)
            s.setblocking(False)
        clients = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(40)]
        accepted = [0] * len(sockets)
        deadline = time.monotonic() + 5
        while sum(accepted) < len(clients) and time.monotonic() < deadline:
            for i, s in enumerate(sockets):
                try:
                    conn, _ = s.accept()
                    conn.close()
                    accepted[i] += 1
                except BlockingIOError:
                    pass
        for c in clients:
            c.close()
        assert sum(accepted) == 40
        assert sum(1 for n in accepted if n) >= 2, accepted  # the kernel spreads them (by 4-tuple hash)
    finally:
        for s in sockets:
            s.close()


def test_a_taken_port_is_a_clear_error_not_a_shared_port():
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        with pytest.raises(PortInUse, match=f"cannot listen on 127.0.0.1:{port}"):
            listen_sockets("127.0.0.1", port)
        # another router (SO_REUSEPORT sockets of the same user) does not get to share it either
        first = listen_sockets("127.0.0.1", free_port(), count=2)
        taken = first[0].getsockname()[1]
        for s in first:
            s.listen(1)
        with pytest.raises(PortInUse):
            listen_sockets("127.0.0.1", taken, count=2)
        for s in first:
            s.close()
    finally:
        holder.close()


def test_router_process_with_its_port_taken_exits_1_naming_it(tmp_path, tiny_model_dir):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        out = subprocess.run([sys.executable, "-m", "router", "--set", f"model.source={tiny_model_dir}",
                              "--set", f"model.cache_dir={tmp_path}", "--set", f"router.port={port}",
                              "--set", "router.host=127.0.0.1", "--set", "discovery.mode=static"],
                             capture_output=True, text=True, timeout=60, check=False)
    finally:
        holder.close()
    assert out.returncode == 1, out.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in out.stderr and "router.port" in out.stderr
    assert "Traceback" not in out.stderr
