"""Rank 0 of a tensor-parallel worker goes down within 2 s of a follower's exit even while its forward
sits in a collective that never returns (NCCL waits for its watchdog, minutes): the heartbeat thread
reads the followers' processes without the step lock (pdorch/worker/tp_steps.py)."""

from __future__ import annotations

import subprocess
import threading
import time

from pdorch.worker.tp_group import FollowerProcesses
from pdorch.worker.tp_steps import StepChannel

WITHIN_S = 2.0


def test_a_dead_follower_breaks_the_group_while_a_forward_holds_the_lock():
    procs = object.__new__(FollowerProcesses)  # its real dead(), over stand-in follower processes
    procs.procs = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
    broken: list[tuple[float, BaseException]] = []
    seen = threading.Event()

    def on_broken(e: BaseException) -> None:
        broken.append((time.monotonic(), e))
        seen.set()

    channel = StepChannel(None, on_broken, heartbeat_s=60.0, dead_ranks=procs.dead)
    channel.lock.acquire()  # a forward in a collective that never ends
    try:
        channel.start_heartbeat()
        time.sleep(0.6)
        assert not broken, "broken while every follower runs"
        procs.procs[1].kill()
        killed = time.monotonic()
        assert seen.wait(WITHIN_S + 1), "no failure within the deadline"
        at, error = broken[0]
        assert at - killed <= WITHIN_S, f"{at - killed:.2f} s"
        assert "[2]" in str(error), error  # names the rank that exited
    finally:
        channel.lock.release()
        channel._stop.set()
        for p in procs.procs:
            p.kill()
            p.wait(5)
