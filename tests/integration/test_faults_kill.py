"""kill -9 a worker in the middle of a request, behind the real router (issue 14, fault tests).

Cluster: the router (in this process) over 2 prefill + 2 decode worker processes, tiny model, TCP
loopback. Prefill runs in chunks of 8 tokens so a long prompt keeps a prefill worker busy for a
while. Tests run in file order and kill one worker each: D1, then P1 (retried on P2), then P2 (the
last one: 503). After each, every surviving process answers and its pool passes check_integrity().
"""

from __future__ import annotations

import os
import signal
import time

import httpx

from tests.fixtures.threads import in_thread
from tests.integration.fault_helpers import (
    assert_survivors_sound,
    fault_fixtures,
    prompt,
    router_workers,
    sse_events,
    wait_running,
)

KILL_TO_ERROR_S = 5.0


cluster, router = fault_fixtures("faults_kill", num_prefill=2, policy="round_robin")


def kill(wp) -> float:
    os.killpg(wp.proc.pid, signal.SIGKILL)
    wp.proc.wait(10)
    return time.monotonic()


def post_in_thread(url: str, body: dict):
    return in_thread(httpx.post, url, json=body, timeout=120)


def test_killing_decode_mid_stream_ends_the_stream_with_an_error_and_routes_around_it(cluster, router):
    decodes = [w for w in cluster.workers if w.role == "decode"]
    body = {"input_ids": prompt(40, seed=1), "stream": True,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": 1900, "ignore_eos": True}}
    with httpx.stream("POST", router.url + "/generate", json=body, timeout=60) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        got = sse_events(ln for _, ln in zip(range(6), lines))  # a few tokens are out
        assert got and "error" not in got[-1]
        serving = [w for w in decodes if router_workers(router)[w.address]["in_flight"] == 1]
        assert len(serving) == 1, router_workers(router)
        victim = serving[0]
        killed_at = kill(victim)
        rest = sse_events(lines)
        ended_at = time.monotonic()
    assert ended_at - killed_at < KILL_TO_ERROR_S
    assert rest and "error" in rest[-1], rest[-3:]
    assert f"decode worker {victim.address}" in rest[-1]["error"]["message"]
    # The router marks it down and sends new requests to the other decode worker.
    survivor = next(w for w in decodes if w is not victim)
    deadline = time.monotonic() + KILL_TO_ERROR_S
    while router_workers(router)[victim.address]["healthy"]:
        assert time.monotonic() < deadline, "the router never marked the killed decode worker down"
        time.sleep(0.05)
    before = router_workers(router)[survivor.address]["routed"]
    for i in range(3):
        out = httpx.post(router.url + "/generate", timeout=60, json={
            "input_ids": prompt(30, seed=10 + i), "sampling_params": {"temperature": 0.0, "max_new_tokens": 2}})
        assert out.status_code == 200, out.text
    assert router_workers(router)[survivor.address]["routed"] - before == 3
    # The prefill workers hold no page of the dead worker's request.
    assert_survivors_sound(cluster)


def test_killing_prefill_mid_prefill_retries_on_the_other_prefill_worker(cluster, router):
    prefills = [w for w in cluster.workers if w.role == "prefill"]
    before = {w.address: router_workers(router)[w.address]["routed"] for w in prefills}
    t, box = post_in_thread(router.url + "/generate", {
        "input_ids": prompt(1900, seed=2), "sampling_params": {"temperature": 0.0, "max_new_tokens": 3,
                                                              "ignore_eos": True}})
    victim = wait_running(cluster, prefills)
    kill(victim)
    t.join(60)
    assert not t.is_alive() and "result" in box, box
    assert box["result"].status_code == 200, box["result"].text
    assert box["result"].json()["meta_info"]["completion_tokens"] == 3
    survivor = next(w for w in prefills if w is not victim)
    after = router_workers(router)
    assert after[survivor.address]["routed"] - before[survivor.address] == 1  # the retry went there
    assert after[victim.address]["routed"] - before[victim.address] == 1
    assert_survivors_sound(cluster)


def test_killing_the_last_prefill_worker_mid_prefill_fails_fast_with_503(cluster, router):
    last = [w for w in cluster.workers if w.role == "prefill" and w.proc.poll() is None]
    assert len(last) == 1
    t, box = post_in_thread(router.url + "/generate", {
        "input_ids": prompt(1900, seed=3), "sampling_params": {"temperature": 0.0, "max_new_tokens": 3}})
    wait_running(cluster, last)
    killed_at = kill(last[0])
    t.join(30)
    assert not t.is_alive() and "result" in box, box
    assert box["at"] - killed_at < KILL_TO_ERROR_S
    assert box["result"].status_code == 503, box["result"].text
    assert "error" in box["result"].json()
    assert_survivors_sound(cluster)  # the decode worker got every page back (P's port refuses: peer_gone)
