"""A job the xdist controller starts (tests/fixtures/early_children.py SharedChild): any worker reads its output
and exit code from the files it leaves, and a worker's wait for a job that never ends has a deadline."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.fixtures.early_children import EarlyJob, SharedChild


def test_a_worker_reads_the_output_and_exit_code_the_job_left(tmp_path):
    code = "import os, sys; print(os.nice(0)); print('err', file=sys.stderr); sys.exit(3)"
    job = EarlyJob("tests/unit/x.py", (sys.executable, "-c", code), timeout_s=30)
    proc = SharedChild(job, tmp_path / "job").start()
    reader = SharedChild(job, tmp_path / "job")  # as a worker makes it: the same files, not the process
    assert reader.result() == (3, "19\n", "err\n")  # its niceness: the lowest priority
    assert proc.wait(timeout=10) == 0


def test_the_wait_for_a_job_that_does_not_end_has_a_deadline(tmp_path):
    job = EarlyJob("tests/unit/x.py", ("sleep", "30"), timeout_s=0.5)
    proc = SharedChild(job, tmp_path / "job").start()
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            SharedChild(job, tmp_path / "job").result()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    assert not (tmp_path / "job.rc").exists()
