"""Clients that go away and a decode worker that freezes, behind the real router (issue 14, fault tests).

Cluster: the router (in this process, a 6 s request deadline) over 1 prefill + 2 decode worker
processes, tiny model, TCP loopback; prefill in chunks of 8 tokens so a long prompt keeps the
prefill worker busy for a while. After each scenario every process answers and its pool passes
check_integrity() with every page back.
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
    worker_stats,
)

DEADLINE_S = 6.0


cluster, router = fault_fixtures("faults_stop", num_prefill=1, policy="round_robin", request_timeout_s=DEADLINE_S)


def test_100_client_disconnects_mid_stream_leak_no_page(cluster, router):
    assert_survivors_sound(cluster)  # the baseline: every page free
    decodes = [w for w in cluster.workers if w.role == "decode"]
    before = {w.address: worker_stats(cluster, w) for w in decodes}
    for i in range(100):
        body = {"input_ids": prompt(20 + i % 40, seed=i), "stream": True,
                "sampling_params": {"temperature": 0.0, "max_new_tokens": 1500, "ignore_eos": True}}
        with httpx.stream("POST", router.url + "/generate", json=body, timeout=60) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if sse_events([line]):
                    break  # a token arrived: go away mid-stream
    assert_survivors_sound(cluster)
    ended = 0
    for w in decodes:
        st = worker_stats(cluster, w)
        ended += st.requests_failed - before[w.address].requests_failed  # aborted ones count as failed
        assert st.requests_finished == before[w.address].requests_finished  # none ran to its end
    assert ended == 100


def test_a_frozen_decode_worker_fails_its_request_by_the_deadline_and_frees_pages_after_sigcont(cluster, router):
    prefill = cluster.prefill
    decodes = [w for w in cluster.workers if w.role == "decode"]
    # NOTE: the prefill worker pushes to both decode workers first (the loop below): its transfer
    # engine then knows their segments. A FIRST push to a frozen worker hangs in Mooncake's P2P
    # metadata handshake (a blocking read, no timeout) under a lock every other first push needs too;
    # that is a Mooncake limitation this test does not cover (see docs/workers.md, fencing).
    for w in decodes:
        assert cluster.generate(prompt(20, seed=50), max_tokens=1, decode=w).token_ids
    sent_at = time.monotonic()
    t, box = in_thread(httpx.post, router.url + "/generate", timeout=60, json={
        "input_ids": prompt(1900, seed=7), "sampling_params": {"temperature": 0.0, "max_new_tokens": 3}})
    wait_running(cluster, [prefill])  # the prompt is being computed; the push into D comes next
    victim = next(w for w in decodes if router_workers(router)[w.address]["in_flight"] == 1)
    other = next(w for w in decodes if w is not victim)
    os.killpg(victim.proc.pid, signal.SIGSTOP)
    try:
        # Nothing else stalls: the same prefill worker serves requests decoded by the other worker.
        for i in range(3):
            res = cluster.generate(prompt(30, seed=70 + i), max_tokens=2, timeout_s=30.0, decode=other)
            assert len(res.token_ids) == 2
        t.join(DEADLINE_S + 10)
        assert not t.is_alive() and "result" in box, box
        assert box["result"].status_code == 504, box["result"].text
        assert box["at"] - sent_at < DEADLINE_S + 3.0  # ended by its deadline (plus scheduling slack)
        st = worker_stats(cluster, prefill)
        assert st.pool_integrity_ok, st.pool_integrity_error
    finally:
        os.killpg(victim.proc.pid, signal.SIGCONT)
    # Thawed, the decode worker learns the request is over and gets every page back.
    assert_survivors_sound(cluster)
    res = cluster.generate(prompt(30, seed=99), max_tokens=2, timeout_s=30.0, decode=victim)
    assert len(res.token_ids) == 2
    assert_survivors_sound(cluster)
