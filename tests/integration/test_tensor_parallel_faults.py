"""Faults of tensor-parallel workers behind the real router (real processes: ranks over gloo, the real
master, transfer engine and store):

- a prefill group one of whose ranks is killed (or hangs: SIGSTOP, caught by model.tp_timeout_s)
  exits as a whole, and the request it had is retried on another prefill worker: none fails;
- a TP-2 decode worker whose follower rank is killed mid-stream (its forwards are collectives, one
  after another) goes down within FAILOVER_S of the kill, and the stream resumes on another decode
  worker with output identical to an uninterrupted run; the time to the next token is printed.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import time

import httpx
import pytest

from engine.tokenizer import Tokenizer
from pdorch.child_process import pid_alive
from pdorch.local_stack.hf_checkpoints import build_checkpoint
from pdorch.local_stack.router import RouterThread, router_config
from pdorch.local_stack.workers import start_cluster
from tests.fixtures.threads import in_thread
from tests.integration.fault_helpers import iter_sse, prompt, router_workers, wait_running

PURE_CLIENT = {"store": {"global_segment_size_mb": 0}}  # a dead D's segment takes no page with it
HANG_TIMEOUT_S = 4.0  # model.tp_timeout_s of the prefill group whose rank is stopped
EXIT_S = 15.0  # a broken group's rank 0 is gone within this long (the hang case adds its timeout)
FAILOVER_S = 2.0  # a killed follower's rank 0 is gone within this long (issue: seen within 2 s, on NCCL too)
KILL_AFTER = 20
MAX_TOKENS = 400


@pytest.fixture(scope="module")
def tp(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tp_faults")
    model_dir = build_checkpoint("qwen2", tmp / "checkpoint", seed=5, std=0.3)  # varied greedy tokens
    c = start_cluster(tmp, model_dir, with_store=True, prefill={"chunk_tokens": 8},
                      decode={"offload_generated_kv": True, "max_local_prefill_tokens": 0})
    with c.stopped_on_failure():
        workers = {"p_killed": c.spawn_worker("prefill", tp_size=2),
                   "p_hung": c.spawn_worker("prefill", sections={"model": {"tp_timeout_s": HANG_TIMEOUT_S}},
                                            tp_size=2),
                   "d_tp2": c.spawn_worker("decode", sections=PURE_CLIENT, tp_size=2)}
        c.wait_ready(*workers.values())
    c.model_dir, c.named = model_dir, {"p1": c.prefill, "d1": c.decode, **workers}
    yield c
    c.stop()


def router_over(c, prefills: list[str], decodes: list[str]) -> RouterThread:
    base = router_config([c.named[p].address for p in prefills], [c.named[d].address for d in decodes],
                         policy="round_robin")
    cfg = dataclasses.replace(c.cfg, router=base.router, discovery=base.discovery)
    return RouterThread(cfg, Tokenizer.from_dir(c.model_dir), c.model_dir).start()


def follower_pids(wp) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(wp.proc.pid), "-f", "pdorch.worker.tp_follower"],
                         capture_output=True, text=True, timeout=10, check=False)
    return [int(p) for p in out.stdout.split()]


def requests_survive_a_broken_prefill_group(c, victim: str, sig: int, within_s: float) -> None:
    """Two requests on a router over {victim (TP 2), p1}: once the victim has one, `sig` goes to its
    follower rank. Both requests are answered in full; the victim's group exits (code 70), followers too."""
    router = router_over(c, [victim, "p1"], ["d1"])
    wp = c.named[victim]
    try:
        body = {"input_ids": prompt(1500, seed=len(victim)), "sampling_params": {
            "temperature": 0.0, "max_new_tokens": 3, "ignore_eos": True}}
        threads = [in_thread(httpx.post, router.url + "/generate", json=body, timeout=180) for _ in range(2)]
        wait_running(c, [wp])
        followers = follower_pids(wp)
        assert len(followers) == 1, followers
        os.kill(followers[0], sig)
        hit_at = time.monotonic()
        assert wp.proc.wait(within_s) == 70, wp.log_tail()
        exited_after = time.monotonic() - hit_at
        for t, box in threads:
            t.join(120)
            assert not t.is_alive() and "result" in box, box
            assert box["result"].status_code == 200, box["result"].text
            assert box["result"].json()["meta_info"]["completion_tokens"] == 3
        assert not pid_alive(followers[0])
        print(f"{victim}: rank 0 exited {exited_after:.2f} s after signal {sig} to its follower")
        assert router_workers(router)[c.named["p1"].address]["healthy"]
    finally:
        router.stop()



def test_a_killed_prefill_rank_takes_its_group_down_and_fails_no_request(tp):
    requests_survive_a_broken_prefill_group(tp, "p_killed", signal.SIGKILL, FAILOVER_S)


def test_a_hung_prefill_rank_is_caught_by_the_collective_timeout(tp):
    requests_survive_a_broken_prefill_group(tp, "p_hung", signal.SIGSTOP, HANG_TIMEOUT_S + EXIT_S)


def stream(router, body: dict, on_token=None) -> list[int]:
    ids = []
    with httpx.stream("POST", router.url + "/generate", json=body, timeout=180) as resp:
        assert resp.status_code == 200, resp.read()
        for ev in iter_sse(resp.iter_lines()):
            assert "error" not in ev, ev
            ids = ev["output_ids"]
            if on_token is not None:
                on_token(ids, ev)
    return ids


def wait_exit(proc) -> float:
    """When `proc` exited (monotonic), polled every 10 ms."""
    deadline = time.monotonic() + EXIT_S
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return time.monotonic()


def test_a_tp2_decode_worker_failing_mid_stream_resumes_elsewhere_with_identical_output(tp):
    router = router_over(tp, ["p1"], ["d_tp2", "d1"])
    d2 = tp.named["d_tp2"]
    body = {"input_ids": prompt(60, seed=9), "stream": True,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": MAX_TOKENS, "ignore_eos": True}}
    killed = {}

    def kill_follower(ids, ev):
        if killed and "resumed" not in killed and "result" in killed["exit"][1]:
            killed["resumed"] = time.monotonic()  # the first event once the TP-2 worker is gone: the other D's
        if killed or len(ids) < KILL_AFTER:
            return
        assert not ev["meta_info"]["finish_reason"], "finished before the kill: raise MAX_TOKENS"
        assert router_workers(router)[d2.address]["in_flight"] == 1, "the stream is not on the TP-2 worker"
        os.kill(follower_pids(d2)[0], signal.SIGKILL)
        killed["at"] = time.monotonic()
        killed["exit"] = in_thread(wait_exit, d2.proc)

    try:
        short = {"input_ids": prompt(20, seed=1), "sampling_params": {"max_new_tokens": 1}}
        for _ in range(2):  # round robin: the stream goes to d_tp2 once a short request went to d1
            routed = router_workers(router)[tp.named["d1"].address]["routed"]
            assert httpx.post(router.url + "/generate", json=short, timeout=60).status_code == 200
            if router_workers(router)[tp.named["d1"].address]["routed"] > routed:
                break
        got = stream(router, body, kill_follower)
        assert killed, "the follower was never killed"
        assert d2.proc.wait(EXIT_S) == 70, d2.log_tail()
        t, box = killed["exit"]
        t.join(EXIT_S)
        exited, resumed = box["result"] - killed["at"], killed["resumed"] - killed["at"]
        print(f"TP-2 decode worker: rank 0 exited {exited:.2f} s after its follower's kill, next token {resumed:.2f} s")
        assert exited <= FAILOVER_S, f"rank 0 exited {exited:.2f} s after the kill"
        reference = stream(router, body)  # on d1, uninterrupted
        assert got == reference and len(reference) == MAX_TOKENS and len(set(reference)) > 1
    finally:
        router.stop()
