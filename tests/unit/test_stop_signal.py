"""pdorch.stop_signal: the main thread's wait wakes for a SIGTERM the kernel handed to another thread."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# A thread sends SIGTERM to itself (pthread_kill): the signal lands on that thread, not the main one,
# as the kernel may do with a process-directed signal in a process of many threads.
CHILD = textwrap.dedent("""
    import signal, sys, threading, time
    from pdorch.stop_signal import stop_on_signals, wait_for_stop

    stop = stop_on_signals()
    def other():
        time.sleep(0.2)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
        time.sleep(60)
    threading.Thread(target=other, daemon=True).start()
    if sys.argv[1] == "helper":
        wait_for_stop(stop, poll_s=0.2)
    else:
        stop.wait()  # the untimed wait the helper replaces
    print("stopped", flush=True)
""")


def run_child(how: str, timeout_s: float) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run([sys.executable, "-c", CHILD, how], check=False, cwd=REPO, capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None  # run() killed it


def test_a_sigterm_on_another_thread_ends_the_wait():
    done = run_child("helper", timeout_s=20)
    assert done is not None and done.returncode == 0 and done.stdout.strip() == "stopped", done


def test_control_an_untimed_wait_sleeps_through_it():
    assert run_child("untimed", timeout_s=3) is None  # still waiting when killed: the bug the helper avoids
