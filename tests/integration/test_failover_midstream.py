"""Mid-stream failover (issue 16, part 4): kill -9 the decode worker serving a stream after 20 tokens;
the client's stream goes on from another decode worker, and its text equals an uninterrupted run.

Cluster: real mooncake_master, 1 prefill + 3 decode worker processes with SmolLM2 (real text, so
the join is checked on real words and spaces), decode.offload_generated_kv on, the real router in
this process (router.mid_stream_failover: auto = on here). Each test kills one decode worker; the
uninterrupted reference runs after the kill, through the same router, on a surviving worker.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import json
import os
import re
import signal
import threading
import time

import httpx
import pytest

from engine.tokenizer import Tokenizer
from pdorch.local_stack.router import RouterThread, router_config, wait_until
from pdorch.local_stack.workers import WorkerCluster, make_config
from store_client.master import MasterProcess

PAGE_SIZE = 16  # page size of the cluster (pdorch/local_stack/workers.py)
KILL_AFTER = 20  # streamed tokens before the kill
MAX_TOKENS = 64
PURE_CLIENT = {"store": {"global_segment_size_mb": 0}}
RESUME_S = 30.0  # kill -> next streamed token; a prefill of ~100 tokens on a busy 2-core machine


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, smollm2_dir):
    tmp = tmp_path_factory.mktemp("failover")
    master = MasterProcess(log_dir=str(tmp)).start()
    c = WorkerCluster(make_config(tmp, smollm2_dir, master, decode={"offload_generated_kv": True}), tmp, master)
    with c.stopped_on_failure():
        # NOTE: the decode workers contribute no memory to the store (pure clients): Mooncake may put
        # a page into the writer's own segment, and a dead worker's segment goes with it.
        wps = [c.spawn_worker("prefill")] + [c.spawn_worker("decode", sections=PURE_CLIENT) for _ in range(3)]
        c.wait_ready(*wps)
    yield c
    c.stop()


@pytest.fixture(scope="module")
def router(cluster, smollm2_dir):
    prefills = [w.address for w in cluster.workers if w.role == "prefill"]
    decodes = [w.address for w in cluster.workers if w.role == "decode"]
    base = router_config(prefills, decodes)
    assert base.router.mid_stream_failover == "auto"
    cfg = dataclasses.replace(cluster.cfg, router=base.router, discovery=base.discovery)
    r = RouterThread(cfg, Tokenizer.from_dir(smollm2_dir), smollm2_dir).start()
    yield r
    r.stop()


def metric(router, name: str) -> float:
    text = httpx.get(router.url + "/metrics", timeout=30).text
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0


def events(lines):
    """SSE events as dicts, ending at [DONE] (an error event is yielded like any other)."""
    for ln in lines:
        if ln == "data: [DONE]":
            return
        if ln.startswith("data: "):
            yield json.loads(ln[6:])


def serving_decode(cluster, router):
    """The one decode worker the router has a stream open on."""
    workers = {w["address"]: w for w in httpx.get(router.url + "/workers", timeout=30).json()["workers"]}
    live = [w for w in cluster.workers if w.role == "decode" and w.proc.poll() is None]
    serving = [w for w in live if workers[w.address]["in_flight"] == 1]
    assert len(serving) == 1, workers
    return serving[0]


def kill(wp) -> float:
    os.killpg(wp.proc.pid, signal.SIGKILL)
    wp.proc.wait(10)
    return time.monotonic()


def run_stream(router, cluster, path: str, body: dict, tokens_of, kill_after: int | None):
    """Stream `body`; after `kill_after` tokens kill -9 the decode worker serving it.
    Returns (events, seconds from the kill to the next event or None)."""
    got, gap = [], None
    with httpx.stream("POST", router.url + path, json=body, timeout=120) as resp:
        assert resp.status_code == 200, resp.read()
        killed_at = None
        for ev in events(resp.iter_lines()):
            got.append(ev)
            assert "error" not in ev, ev
            if killed_at is not None and gap is None:
                gap = time.monotonic() - killed_at
            if kill_after is not None and killed_at is None and tokens_of(got) >= kill_after:
                assert not ev_finished(ev), "the request finished before the kill: raise MAX_TOKENS"
                victim = serving_decode(cluster, router)
                killed_at = kill(victim)
    return got, gap


def ev_finished(ev: dict) -> bool:
    if "choices" in ev:
        return bool(ev["choices"] and ev["choices"][0]["finish_reason"])
    return bool(ev["meta_info"]["finish_reason"])


def check_resumed_from_store(router, before: dict) -> None:
    """One failover, resumed; it computed at most the partial last page plus one page whose offload
    write may still have been in flight at the kill; the generated pages came from the store."""
    after = resume_counters(router)
    assert after["resumed"] - before["resumed"] == 1
    assert after["failed"] == before["failed"]
    assert after["computed"] - before["computed"] <= 2 * PAGE_SIZE - 1, (before, after)
    assert after["store"] - before["store"] >= KILL_AFTER - PAGE_SIZE, (before, after)


def resume_counters(router) -> dict:
    return {"resumed": metric(router, 'pdorch_router_failovers_total{outcome="resumed"}'),
            "failed": metric(router, 'pdorch_router_failovers_total{outcome="failed"}'),
            "computed": metric(router, "pdorch_router_failover_computed_tokens_total"),
            "store": metric(router, 'pdorch_router_failover_cached_tokens_total{tier="store"}')}


def test_openai_chat_stream_survives_the_decode_worker_dying(cluster, router):
    body = {"model": "SmolLM2-135M-Instruct", "stream": True, "temperature": 0, "max_tokens": MAX_TOKENS,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "Write a short story about a lighthouse keeper and a storm."}]}
    n_chunks = lambda evs: sum(1 for e in evs if e["choices"])

    def text(evs):
        return "".join(e["choices"][0]["delta"].get("content") or "" for e in evs if e["choices"])

    before = resume_counters(router)
    killed, gap = run_stream(router, cluster, "/v1/chat/completions", body, n_chunks, KILL_AFTER)
    assert gap is not None and gap < RESUME_S
    check_resumed_from_store(router, before)
    reference, _ = run_stream(router, cluster, "/v1/chat/completions", body, n_chunks, None)
    assert text(killed) == text(reference) and len(text(reference)) > 100
    # Usage counts the client's prompt (not prompt + streamed tokens) and every generated token.
    # (Cached tokens differ: the reference runs second and hits the prefill worker's L1.)
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert [killed[-1]["usage"][k] for k in counts] == [reference[-1]["usage"][k] for k in counts]
    assert reference[-1]["usage"]["completion_tokens"] == MAX_TOKENS
    finishes = [e["choices"][0]["finish_reason"] for e in killed if e["choices"]]
    assert finishes[-1] == "length" and not any(finishes[:-1])


def test_sglang_generate_stream_survives_the_decode_worker_dying(cluster, router):
    tok = Tokenizer.from_dir(cluster.cfg.model.source)
    ids = tok.encode_chat([{"role": "user", "content": "Describe a walk through an old forest in autumn."}])
    body = {"input_ids": ids, "stream": True, "sampling_params": {"temperature": 0, "max_new_tokens": MAX_TOKENS}}
    n_tokens = lambda evs: len(evs[-1]["output_ids"])

    before = resume_counters(router)
    killed, gap = run_stream(router, cluster, "/generate", body, n_tokens, KILL_AFTER)
    assert gap is not None and gap < RESUME_S
    check_resumed_from_store(router, before)
    reference, _ = run_stream(router, cluster, "/generate", body, n_tokens, None)
    k, r = killed[-1], reference[-1]
    assert k["output_ids"] == r["output_ids"] and len(r["output_ids"]) == MAX_TOKENS
    assert k["text"] == r["text"] == tok.decode(r["output_ids"], skip_special_tokens=True)
    # Cumulative text and ids only ever grow: nothing was taken back or repeated at the join.
    for a, b in itertools.pairwise(killed):
        assert b["text"].startswith(a["text"]) and b["output_ids"][:len(a["output_ids"])] == a["output_ids"]
    assert k["meta_info"]["prompt_tokens"] == len(ids) == r["meta_info"]["prompt_tokens"]
    assert k["meta_info"]["completion_tokens"] == MAX_TOKENS
    assert k["meta_info"]["finish_reason"] == {"type": "length", "length": MAX_TOKENS}


PREEMPT_PAGES = 10  # the small decode worker's pool: two of the streams below (8 pages each) outgrow it
PREEMPT_TOKENS = 80


def test_a_preempted_and_resumed_stream_survives_its_decode_worker_dying(cluster, smollm2_dir):
    """A decode worker whose pool runs dry preempts a stream (decode_node/preemption.py); once that
    stream has resumed there, the worker is killed: the router resumes it on another decode worker,
    and every stream equals an uninterrupted run of it."""
    small = cluster.spawn_worker("decode", sections=PURE_CLIENT, num_pages=PREEMPT_PAGES, growth_reserve=0.0)
    cluster.wait_ready(small)
    big = next(w for w in cluster.workers if w.role == "decode" and w is not small and w.proc.poll() is None)
    prefill = next(w for w in cluster.workers if w.role == "prefill")
    base = router_config([prefill.address], [small.address, big.address], policy="least_load")
    cfg = dataclasses.replace(cluster.cfg, router=base.router, discovery=base.discovery)
    tok = Tokenizer.from_dir(smollm2_dir)
    router = RouterThread(cfg, tok, smollm2_dir).start()
    try:
        topics = ["a lighthouse in winter", "the first train of the morning", "a garden after rain",
                  "an old clock shop"]
        bodies = [{"input_ids": tok.encode_chat([{"role": "user", "content": f"Write a short story about {t}."}]),
                   "stream": True, "sampling_params": {"temperature": 0, "max_new_tokens": PREEMPT_TOKENS}}
                  for t in topics]
        wait_until(lambda: all(w["healthy"] for w in httpx.get(router.url + "/workers", timeout=30).json()["workers"]),
                   30, "the router's workers healthy")
        # the uninterrupted runs: together on the large decode worker, which never preempts
        with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
            uninterrupted = list(pool.map(lambda b: cluster.generate(b["input_ids"], max_tokens=PREEMPT_TOKENS,
                                                                     decode=big).token_ids, bodies))

        streams: list[list[dict]] = [[] for _ in bodies]
        killed = threading.Event()

        def stream(i: int) -> None:
            with httpx.stream("POST", router.url + "/generate", json=bodies[i], timeout=180) as resp:
                assert resp.status_code == 200, resp.read()
                for ev in events(resp.iter_lines()):
                    assert "error" not in ev, ev
                    streams[i].append(ev)
                    # the first stream back from a preemption (it reports it) kills its decode worker
                    if ev["meta_info"]["preemptions"] and not ev_finished(ev) and not killed.is_set():
                        killed.set()
                        kill(small)

        with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
            for f in [pool.submit(stream, i) for i in range(len(bodies))]:
                f.result(timeout=300)
        assert killed.is_set(), "no stream was preempted on the small decode worker"
        assert [s[-1]["output_ids"] for s in streams] == uninterrupted
        assert all(len(u) == PREEMPT_TOKENS for u in uninterrupted)
        # the killing stream was preempted on the small worker, then resumed on the other one
        assert max(s[-1]["meta_info"]["preemptions"] for s in streams) >= 1
        assert metric(router, 'pdorch_router_failovers_total{outcome="resumed"}') >= 1
        assert metric(router, 'pdorch_router_failovers_total{outcome="failed"}') == 0
    finally:
        router.stop()
