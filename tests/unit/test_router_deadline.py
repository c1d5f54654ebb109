"""One deadline per request, end to end (issue 14, hazard 3): a retry gets only what is left of the
request's deadline, never a fresh one, and the deadline sent to the decode worker is that remainder.
Real gRPC stand-in workers behind the router app."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from pdorch.local_stack.processes import free_port, stop_process, wait_for_port
from pdorch.local_stack.router import wait_until


def _gen(r, result: dict) -> None:
    resp = httpx.post(r.url + "/generate", json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}},
                      timeout=30)
    result["status"], result["body"] = resp.status_code, resp.json()


def test_a_request_past_its_deadline_is_not_retried_with_a_fresh_one(standins, make_router):
    p1, p2 = standins("prefill"), standins("prefill")
    d1, d2 = standins("decode", first_token_delay_s=10), standins("decode", first_token_delay_s=10)
    r = make_router([p1.address, p2.address], [d1.address, d2.address], policy="round_robin",
                    request_timeout_s=1.0)
    result: dict = {}
    _gen(r, result)
    assert result["status"] == 504, result
    assert result["body"]["error"]["type"] == "timeout"
    # The first attempt used the whole deadline: a second one would have had a fresh second.
    assert len(d1.behavior.calls) + len(d2.behavior.calls) == 1


def test_a_retry_gets_only_the_time_that_is_left(standins, make_router):
    p1, p2 = standins("prefill"), standins("prefill")
    d1, d2 = standins("decode", first_token_delay_s=10), standins("decode", first_token_delay_s=10)
    timeout_s, spent_s = 6.0, 1.0
    r = make_router([p1.address, p2.address], [d1.address, d2.address], policy="round_robin",
                    request_timeout_s=timeout_s)
    result: dict = {}
    client = threading.Thread(target=_gen, args=(r, result))
    client.start()
    try:
        wait_until(lambda: len(d1.behavior.calls) + len(d2.behavior.calls) == 1, 10, "the first attempt")
        first, other = (d1, d2) if d1.behavior.calls else (d2, d1)
        assert 0 < first.behavior.calls[0].timeout_s <= timeout_s  # what is left of the deadline
        other.behavior.first_token_delay_s = 0.0
        time.sleep(spent_s)
        first.stop()  # the first attempt fails (UNAVAILABLE) after spent_s of the deadline
    finally:
        client.join(timeout=30)
    assert not client.is_alive()
    assert result["status"] == 200, result
    retried = other.behavior.calls
    assert len(retried) == 1
    # NOTE: at least spent_s passed between the request's arrival and the retry (a lower bound that
    # holds however loaded the machine is).
    assert 0 < retried[0].timeout_s <= timeout_s - spent_s


def test_a_hung_worker_does_not_hold_the_answer_past_the_deadline(standins, make_router):
    # A frozen decode worker (SIGSTOP): its kernel still accepts the connection, nothing answers.
    # Probing which worker failed (Info, up to 1 s) must not delay the 504 past the deadline.
    p = standins("prefill")
    port = free_port()
    d = subprocess.Popen([sys.executable, "-m", "pdorch.local_stack.standin", "--role", "decode", "--port", str(port)],
                         start_new_session=True, cwd=Path(__file__).resolve().parents[2])  # tests/ is not installed
    try:
        wait_for_port(port, 15, d)
        timeout_s = 1.0
        r = make_router([p.address], [f"127.0.0.1:{port}"], policy="round_robin", request_timeout_s=timeout_s)
        wait_until(lambda: all(w["healthy"] for w in httpx.get(r.url + "/workers").json()["workers"]), 10,
                   "both workers to be healthy")
        os.kill(d.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        result: dict = {}
        _gen(r, result)
        elapsed = time.monotonic() - t0
    finally:
        os.kill(d.pid, signal.SIGCONT)
        stop_process(d)
    assert result["status"] == 504, result
    # NOTE: 0.8 s of slack for a loaded machine; the probe alone would add a whole second.
    assert elapsed < timeout_s + 0.8, elapsed
