"""Worker faults and offload off, with SmolLM2 (a prefill long enough to kill a worker in the middle).

Cluster: real mooncake_master, two prefill workers (P1 gets killed), one decode worker with
`offload_generated_kv: false`. One test kills P1, another D; the `cluster` fixture starts a killed
worker again before the next test, so every test runs alone or in any order.
"""

from __future__ import annotations

import os
import signal
import time

import grpc
import pytest

from engine.tokenizer import Tokenizer
from pdorch.local_stack.workers import start_cluster, worker_metric
from pdorch.worker.prompt_pages import reusable_pages
from proto.pdorch.v1 import worker_pb2 as pb
from tests.fixtures.threads import in_thread
from tests.integration.test_disagg_smollm2 import long_document

PAGE_SIZE = 16


@pytest.fixture(scope="module")
def tok(smollm2_dir):
    return Tokenizer.from_dir(smollm2_dir)


@pytest.fixture(scope="module")
def module_cluster(tmp_path_factory, smollm2_dir):
    c = start_cluster(tmp_path_factory.mktemp("fault_cluster"), smollm2_dir, with_store=True, num_prefill=2,
                      # NOTE: no prefix cache on D: these tests read the store (offload off: the prompt only)
                      decode={"offload_generated_kv": False, "prefix_cache": False})
    yield c
    c.stop()


@pytest.fixture
def cluster(module_cluster):
    """The module's cluster with P1, P2 and D all alive: a worker an earlier test killed is started
    again in its place (same role, same position in `workers`, and `prefill`/`decode` point at it)."""
    c = module_cluster
    started = []
    for i, old in list(enumerate(c.workers)):
        if old.proc.poll() is None:
            continue
        if c.prefill is old:
            c.prefill = None
        if c.decode is old:
            c.decode = None
        new = c.spawn_worker(old.role)  # appended to c.workers; becomes c.prefill / c.decode when None
        c.workers.remove(new)
        c.workers[i] = new
        started.append(new)
    c.wait_ready(*started)
    return c


def wait_running(cluster, wp, timeout_s: float = 60.0) -> None:
    """Until prefill worker `wp` reports a request in progress."""
    deadline = time.monotonic() + timeout_s
    while cluster.stats("prefill", wp).info.running_requests == 0:
        assert time.monotonic() < deadline, "the request never reached the prefill worker"
        time.sleep(0.05)


def test_multiturn_with_offload_off_hits_only_the_turn_one_prompt(cluster, tok):
    turn1, out1, turn2 = cluster.two_turns(tok, "Describe a lighthouse at night in three sentences.",
                                           "Now make it rhyme.")
    assert (len(turn1) + len(out1) - 1) // PAGE_SIZE > len(turn1) // PAGE_SIZE  # the answer filled at least one page
    local = worker_metric(cluster.decode, "pdorch_decode_prompt_plans_total", where="local")
    got = cluster.generate(turn2, max_tokens=4)
    assert got.cached.store == min(len(turn1) // PAGE_SIZE, reusable_pages(len(turn2), PAGE_SIZE)) * PAGE_SIZE
    assert got.cached.device == 0
    # D wrote no generated page; it served turn 2 itself (a short new message) and wrote the full
    # prompt pages it computed, as a prefill worker writes back what it computed
    assert worker_metric(cluster.decode, "pdorch_decode_prompt_plans_total", where="local") == local + 1
    cluster.wait_idle("decode")
    assert cluster.stats("decode").store_pages_written == len(turn2) // PAGE_SIZE - len(turn1) // PAGE_SIZE
    cluster.assert_pools_sound()


def test_client_cancel_during_prefill_aborts_on_prefill_and_frees_pages(cluster, tok):
    p2 = [wp for wp in cluster.workers if wp.role == "prefill"][1]
    before = cluster.stats("prefill", p2)
    prompt = tok.encode_chat([{"role": "user", "content": long_document(75) + "\nCount the boats."}])
    req = pb.GenerateRequest(request_id="cancel-me", token_ids=prompt, prefill_address=p2.address,
                             sampling=pb.SamplingParams(max_tokens=4, temperature=0.0), timeout_s=120)
    call = cluster.decode_stub().Generate(req, timeout=130)  # the stream starts now
    wait_running(cluster, p2)
    call.cancel()  # the router going away: D cancels its Prefill call, P aborts the request
    st = cluster.wait_idle("prefill", timeout_s=20, wp=p2)
    assert st.requests_aborted == before.requests_aborted + 1
    assert st.requests_finished == before.requests_finished
    cluster.assert_pools_sound()


def test_request_deadline_fails_it_with_a_clear_error_on_both_workers(cluster, tok):
    p2 = [wp for wp in cluster.workers if wp.role == "prefill"][1]
    before = cluster.stats("prefill", p2)
    prompt = tok.encode_chat([{"role": "user", "content": long_document(75) + "\nName a town."}])
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as err:
        cluster.generate(prompt, max_tokens=4, timeout_s=1.0, prefill_address=p2.address)
    assert time.monotonic() - t0 < 5.0
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert f"prefill worker {p2.address} did not answer" in err.value.details()
    st = cluster.wait_idle("prefill", timeout_s=20, wp=p2)
    assert st.requests_failed == before.requests_failed + 1
    cluster.assert_pools_sound()


def test_killing_prefill_mid_request_fails_it_fast_and_decode_keeps_serving(cluster, tok):
    p1, p2 = [wp for wp in cluster.workers if wp.role == "prefill"]
    prompt = tok.encode_chat([{"role": "user", "content": long_document(80) + "\nSummarize."}])
    assert len(prompt) > 1800
    t, box = in_thread(cluster.generate, prompt, max_tokens=4, prefill_address=p1.address)
    wait_running(cluster, p1)
    killed_at = time.monotonic()
    os.killpg(p1.proc.pid, signal.SIGKILL)
    p1.proc.wait(10)
    t.join(15)
    assert not t.is_alive()
    err = box.get("error")
    assert isinstance(err, grpc.RpcError), box
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert f"prefill worker {p1.address}" in err.details()
    assert box["at"] - killed_at < 10.0
    # D keeps serving through the other prefill worker.
    ok = cluster.generate(tok.encode_chat([{"role": "user", "content": "Say hello."}]), max_tokens=4,
                          prefill_address=p2.address)
    assert len(ok.token_ids) >= 1 and ok.finish_reason in ("stop", "length")
    cluster.assert_pools_sound()


def test_killing_decode_mid_request_makes_prefill_drop_the_work(cluster, tok):
    p2 = [wp for wp in cluster.workers if wp.role == "prefill"][1]
    before = cluster.stats("prefill", p2)
    prompt = tok.encode_chat([{"role": "user", "content": long_document(70) + "\nList the towns."}])
    t, box = in_thread(cluster.generate, prompt, max_tokens=4, prefill_address=p2.address)
    wait_running(cluster, p2)
    os.killpg(cluster.decode.proc.pid, signal.SIGKILL)
    cluster.decode.proc.wait(10)
    t.join(15)
    assert "error" in box
    st = cluster.wait_idle("prefill", timeout_s=30, wp=p2)
    assert st.pool_integrity_ok, st.pool_integrity_error
    assert st.info.free_pages == st.info.total_pages
    assert st.requests_failed > before.requests_failed
    assert st.requests_finished == before.requests_finished
