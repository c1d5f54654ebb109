"""The workers' side of a trace through the real stack (issue 54): a turn whose prefix came from the
store, a stream failed over to another decode worker, a preempted stream (docs/operations.md,
"Reading a trace", "Worker spans").

One stack: mooncake_master, one prefill and two decode worker processes (tiny random-weights model,
decode offload on; the decode workers contribute no store memory, so a killed one takes no page with
it), the router in this process, every process exporting to an OTLP receiver the test serves.
"""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest

from pdorch.local_stack.otlp import OtlpReceiver
from pdorch.local_stack.router import cluster_router
from pdorch.local_stack.workers import WorkerCluster, make_config
from pdorch.tracing import names
from store_client.master import MasterProcess
from tests.fixtures.traced_stack import Stack, observability, trace_id_of
from tests.integration.fault_helpers import iter_sse, kill_serving_decode

PAGE_SIZE = 16  # pdorch/local_stack/workers.py
PURE_CLIENT = {"store": {"global_segment_size_mb": 0}}
STORE_PAGES = f"{names.PAGES}.store"
DECODE_PAGES = 48
# 40-token prompts and 600 tokens: 40 pages each at their end, and two streams outgrow the 48-page pool
# once they hold 49 between them, so they collide even when one started well after the other (a loaded
# machine staggers them; at 360 tokens, 25 pages each, only their last pages collided: seen unpreempted once).
PREEMPT_STREAMS, PREEMPT_TOKENS = 4, 600


def pages(span, *tiers: str) -> dict[str, int]:
    """A span's page counts by tier (or miss reason): {"store": 5, ...}."""
    return {t: span.attributes[f"{names.PAGES}.{t}"] for t in tiers}


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_model_dir):
    tmp = tmp_path_factory.mktemp("traces_workers")
    otlp = OtlpReceiver().start()
    master = MasterProcess(log_dir=str(tmp)).start()
    # max_local_prefill_tokens 0: every request calls the prefill worker; a small decode pool, all of
    # it admitted (growth_reserve 0): PREEMPT_STREAMS outgrow it
    cfg = make_config(tmp, tiny_model_dir, master, observability=observability(otlp),
                      decode={"offload_generated_kv": True, "max_local_prefill_tokens": 0,
                              "num_pages": DECODE_PAGES, "growth_reserve": 0.0})
    cluster = WorkerCluster(cfg, tmp, master)
    with cluster.stopped_on_failure():
        cluster.wait_ready(cluster.spawn_worker("prefill"),
                           *[cluster.spawn_worker("decode", sections=PURE_CLIENT) for _ in range(2)])
        router = cluster_router(cluster, tiny_model_dir)
    yield Stack(cluster, router, otlp)
    router.stop()
    cluster.stop()
    otlp.stop()


def test_a_prefix_from_the_store_shows_as_store_reads_of_as_many_pages(stack):
    text = "Describe the harbour of an old fishing town at dawn, its boats, its nets and its gulls. " * 3
    stack.chat(text)
    for wp in stack.cluster.workers:  # the write-back done, then every worker's L1 dropped
        stack.cluster.wait_idle(wp.role, wp=wp)
    r = httpx.post(stack.router.url + "/flush_cache", timeout=30)
    assert r.status_code == 200, r.text
    r = stack.chat(text)
    usage = r.json()["usage"]
    store_tokens = usage["prompt_tokens_details"]["cached_tokens_details"]["store"]
    # every full page of the prompt was in the store, the last partial one is computed
    assert store_tokens == (usage["prompt_tokens"] - 1) // PAGE_SIZE * PAGE_SIZE >= 4 * PAGE_SIZE
    read_names = {names.DECODE_STORE_READ, names.PREFILL_STORE_READ}
    spans = {s.name: s for s in stack.otlp.wait_for(trace_id_of(r), read_names | {
        "router.request", "decode.generate", "prefill.prefill", names.DECODE_PREFIX, names.PREFILL_PREFIX,
        names.PREFILL_COMPUTE})}
    # tokens = pages x page_size: D reads the prefix pages it holds, P the same pages for its attention
    for name in read_names:
        assert spans[name].attributes[STORE_PAGES] * PAGE_SIZE == store_tokens, spans[name]
        assert spans[name].attributes[names.KEYS] == store_tokens // PAGE_SIZE
        assert spans[name].attributes[names.STORE_RESULT] == "ok" and spans[name].status_code != 2
    assert spans[names.DECODE_STORE_READ].parent_span_id == spans["decode.generate"].span_id
    assert spans[names.PREFILL_STORE_READ].parent_span_id == spans["prefill.prefill"].span_id
    # the prefix match's tiers: all from the store, nothing from L1 (flushed), no page recomputed
    store_pages = store_tokens // PAGE_SIZE
    assert pages(spans[names.DECODE_PREFIX], "device", "inflight", "store") == \
        {"device": 0, "inflight": 0, "store": store_pages}
    assert pages(spans[names.PREFILL_PREFIX], "device", "inflight", "store", "ssd", "holes") == \
        {"device": 0, "inflight": 0, "store": store_pages, "ssd": 0, "holes": 0}
    assert spans[names.PREFILL_COMPUTE].attributes[names.TOKENS] == usage["prompt_tokens"] - store_tokens
    assert spans["router.request"].attributes[f"{names.CACHED_TOKENS}.store"] == store_tokens


def test_a_stream_failed_over_shows_both_decode_workers_in_one_trace(stack):
    body = {"messages": [{"role": "user", "content": "Tell me about the sea."}], "max_tokens": 400,
            "temperature": 0, "stream": True, "ignore_eos": True}
    chunks = 0
    with httpx.stream("POST", stack.router.url + "/v1/chat/completions", json=body, timeout=120) as resp:
        assert resp.status_code == 200, resp.read()
        trace_id = trace_id_of(resp)
        for ev in iter_sse(resp.iter_lines()):
            assert "error" not in ev, ev
            chunks += 1
            if chunks == 12:
                assert not ev["choices"][0]["finish_reason"]
                kill_serving_decode(stack.router, stack.cluster)
    spans = stack.otlp.wait_for(trace_id, {"router.request", "router.attempt", "decode.generate"})
    [root] = [s for s in spans if s.name == "router.request"]
    first, second = sorted((s for s in spans if s.name == "router.attempt"), key=lambda s: s.start_ns)
    assert root.attributes[names.FAILOVERS] == 1 and root.status_code != 2
    assert first.parent_span_id == second.parent_span_id == root.span_id
    dead, survivor = first.attributes[names.DECODE_WORKER], second.attributes[names.DECODE_WORKER]
    assert dead != survivor and root.attributes[names.DECODE_WORKER] == survivor
    assert first.status_code == 2 and first.status_message.startswith(f"decode worker {dead} failed mid-stream")
    assert "UNAVAILABLE" in first.status_message and not first.attributes["pdorch.resumed"]
    assert second.status_code != 2 and second.attributes["pdorch.resumed"]
    # the survivor's Generate call is the second attempt's child, its Prefill call under it; the dead
    # worker's (SIGKILLed: maybe never exported) is the first's
    generates = {s.parent_span_id: s for s in spans if s.name == "decode.generate"}
    resumed = generates[second.span_id]
    assert resumed.instance.endswith(survivor.replace(":", "-"))
    assert set(generates) <= {first.span_id, second.span_id}
    assert [s.parent_span_id for s in spans if s.name == "prefill.prefill"][-1] == resumed.span_id


def test_a_preempted_stream_shows_its_pause_in_its_trace(stack):
    """Four streams on one or two decode workers (the failover above may have left one): on either,
    two of them outgrow the pool, and the latest arrival is preempted."""
    live = {w.address.replace(":", "-") for w in stack.cluster.workers if w.role == "decode" and w.proc.poll() is None}
    bodies = [{"input_ids": [(seed * 7919 + i * 31) % 1000 + 10 for i in range(40)],
               "sampling_params": {"max_new_tokens": PREEMPT_TOKENS, "temperature": 0, "ignore_eos": True}}
              for seed in range(PREEMPT_STREAMS)]
    with concurrent.futures.ThreadPoolExecutor(PREEMPT_STREAMS) as pool:
        responses = list(pool.map(lambda b: httpx.post(stack.router.url + "/generate", json=b, timeout=120), bodies))
    assert [r.status_code for r in responses] == [200] * PREEMPT_STREAMS
    preempted = [r for r in responses if r.json()["meta_info"]["preemptions"]]
    assert preempted, "no stream was preempted: raise PREEMPT_TOKENS"
    for r in preempted:
        times = r.json()["meta_info"]["preemptions"]
        spans = stack.otlp.wait_for(trace_id_of(r), {"router.request", "decode.generate", names.DECODE_PREEMPTED})
        [root] = [s for s in spans if s.name == "router.request"]
        [generate] = [s for s in spans if s.name == "decode.generate"]
        pauses = [s for s in spans if s.name == names.DECODE_PREEMPTED]
        assert root.attributes[names.PREEMPTIONS] == times == len(pauses)
        assert all(p.parent_span_id == generate.span_id and generate.start_ns < p.start_ns < p.end_ns
                   for p in pauses)
        assert generate.instance.removeprefix("decode-") in live
