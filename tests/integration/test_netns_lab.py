"""The network-namespace lab itself: a second lab of the same test session starts cleanly after the
first, even when a process outlived its spawned parent and kept the first lab's namespace alive.

This failed on CI before: the partition test's `ip link add pd<pid>v1 ...` found the chart test's
veth still there ("File exists"), because both labs used the same names and a deleted namespace, and
its veth, go away only when the last process in it has gone and the kernel has torn it down."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.fixtures.netns import NetnsLab, netns_available

pytestmark = pytest.mark.skipif(netns_available() is not None, reason=f"network namespaces: {netns_available()}")


def _alive(pid: int) -> bool:
    """Running: a zombie (killed, not yet reaped by whoever inherited it) counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_second_lab_starts_after_a_straggler_kept_the_first_alive(tmp_path):
    first = NetnsLab()
    try:
        first.add_host("a")
        # The child leaves the spawned process's group (setsid), so stopping the parent leaves it running.
        first.spawn("a", ["sh", "-c", "setsid sleep 120 & exec sleep 120"], dict(os.environ), tmp_path / "a.log")
        deadline = time.monotonic() + 10
        while len(first.pids("a")) < 2:
            assert time.monotonic() < deadline, f"the straggler never started: {first.pids('a')}"
            time.sleep(0.05)
        inside = first.pids("a")
    finally:
        stragglers = first.close()
    assert len(stragglers) == 1 and stragglers[0] in inside, (stragglers, inside)
    deadline = time.monotonic() + 10
    while _alive(stragglers[0]):  # SIGKILLed
        assert time.monotonic() < deadline, "the straggler survived close()"
        time.sleep(0.05)

    second = NetnsLab()
    try:
        assert second.tag != first.tag
        ip = second.add_host("a")
        second.spawn("a", ["sleep", "120"], dict(os.environ), tmp_path / "b.log")
        assert ip in second.exec("a", ["ip", "-o", "addr", "show", "dev", "eth0"])
    finally:
        assert second.close() == []
