"""Fan-out: 8 requests with one identical 2,048-token prompt sent at once through the real router -> D ->
P (SmolLM2, real mooncake_master and transfer engine). The prefix is computed once and pushed once:
the decode worker's duplicates wait for the pages the first one receives and share them in its pool
(decode_node/admission.py), and a duplicate that reaches P waits for the pages there
(prefill_node/inflight.py); the 7 duplicates report those pages as cached tier `inflight`, their TTFT
stays within 1.3x the first one's, and every greedy output equals the request's output sent alone on a
cold cache. With 1 prefill worker, then with 2 behind two router replicas (a request whose prefix is in
flight on a worker goes there: the router's own guess, or the worker's claim in its KV events)."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import time

import httpx
import pytest

from engine.tokenizer import Tokenizer
from pdorch.local_stack.router import RouterThread, router_config, wait_until
from pdorch.local_stack.workers import start_cluster, worker_metric
from tests.integration.fault_helpers import router_workers

PROMPT_TOKENS = 2048
MAX_TOKENS = 8
FANOUT = 8
PAGE = 16
SHARED = (PROMPT_TOKENS - 1) // PAGE * PAGE  # the reusable pages: every full page but the last token's
TTFT_RATIO = 1.3
TTFT_ATTEMPTS = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, smollm2_dir):
    # chunks of 256 tokens: the first request computes its prefix in 8 forwards while the others arrive
    # D's pool holds the 8 prompts at once (128 pages each): none waits at D for pages
    c = start_cluster(tmp_path_factory.mktemp("inflight"), smollm2_dir, with_store=True, num_prefill=2,
                      prefill={"chunk_tokens": 256}, decode={"num_pages": 1200})
    c.model_dir = smollm2_dir
    yield c
    c.stop()


def prompt() -> list[int]:
    return [(i * 7919 + 13) % 40000 + 100 for i in range(PROMPT_TOKENS)]


def routers(cluster, prefills: list, replicas: int) -> list[RouterThread]:
    """`replicas` routers over the same workers, each with its own KV index (as router replicas)."""
    out = []
    for _ in range(replicas):
        base = router_config([p.address for p in prefills], [cluster.decode.address], policy="cache_aware")
        cfg = dataclasses.replace(cluster.cfg, router=base.router, discovery=base.discovery)
        out.append(RouterThread(cfg, Tokenizer.from_dir(cluster.model_dir), cluster.model_dir).start())
    for r in out:  # every replica routes on the workers' KV events (not on its own guess: a stream not live)
        wait_until(lambda r=r: all((w.get("kv_events") or {}).get("state") == "live"
                                   for w in router_workers(r).values()), 30, "the router's KV event streams live")
    return out


def stream(url: str, rid: str) -> dict:
    """One /generate stream: its output ids, meta_info, and TTFT measured by the client."""
    body = {"input_ids": prompt(), "stream": True, "rid": rid,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": MAX_TOKENS, "ignore_eos": True}}
    t0 = time.perf_counter()
    out: dict = {"ttft": None}
    with httpx.stream("POST", url + "/generate", json=body, timeout=300) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            assert "error" not in ev, ev
            if out["ttft"] is None and ev["output_ids"]:
                out["ttft"] = time.perf_counter() - t0
            out["ids"], out["meta"] = ev["output_ids"], ev["meta_info"]
    return out


def computed(prefills) -> float:
    return sum(worker_metric(p, "pdorch_prefill_prompt_tokens_total", source="computed") for p in prefills)


def choices(router) -> dict[str, float]:
    """The router's prefill choices by reason (pdorch_router_prefill_choices_total), those made."""
    out = {}
    for line in httpx.get(router.url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("pdorch_router_prefill_choices_total{"):
            value = float(line.rsplit(" ", 1)[1])
            if value:
                out[line.split('reason="', 1)[1].split('"', 1)[0]] = value
    return out


def flush(url: str) -> None:
    assert httpx.post(url + "/flush_cache?store=true", timeout=60).status_code == 200


@pytest.mark.slow
@pytest.mark.parametrize("num_prefill, replicas", [(1, 1), (2, 2)])
def test_a_fanout_of_one_prompt_computes_its_prefix_once(cluster, num_prefill, replicas):
    prefills = [w for w in cluster.workers if w.role == "prefill"][:num_prefill]
    (reference,) = routers(cluster, prefills, 1)  # its routing guesses must not steer the fan-out: its own router
    try:
        flush(reference.url)
        alone = stream(reference.url, f"alone-{num_prefill}")
    finally:
        reference.stop()
    assert alone["meta"]["cached_tokens"] == 0 and len(alone["ids"]) == MAX_TOKENS
    rs = routers(cluster, prefills, replicas)
    try:
        # NOTE: the TTFT bound is a timing on 2 shared cores (seen 1.303x once in a whole-suite run): a fan-out
        # that misses it runs once more; everything else is asserted on every fan-out
        for attempt in range(TTFT_ATTEMPTS):
            for r in rs:  # NOTE: each replica forgets the store's pages only when it flushes (docs/workers.md)
                flush(r.url)
            before = computed(prefills)
            with concurrent.futures.ThreadPoolExecutor(FANOUT) as pool:
                urls = [rs[i % replicas].url for i in range(FANOUT)]
                outs = list(pool.map(stream, urls, [f"fan-{num_prefill}-{attempt}-{i}" for i in range(FANOUT)]))
            after = computed(prefills)
            per_worker = [computed([p]) for p in prefills]
            cached = sorted((o["meta"]["cached_tokens"], o["meta"]["cached_tokens_details"]["inflight"] > 0)
                            for o in outs)
            first = min(outs, key=lambda o: o["meta"]["cached_tokens"])
            waited = max(o["ttft"] for o in outs if o is not first)
            print(f"P={num_prefill}: computed {after - before:.0f} prompt tokens for {FANOUT} requests of "
                  f"{PROMPT_TOKENS} (per worker, cumulative: {per_worker}); cached (tokens, waited) {cached}; TTFT "
                  f"first {first['ttft']:.2f} s, slowest duplicate {waited:.2f} s ({waited / first['ttft']:.2f}x; "
                  f"all {sorted(round(o['ttft'], 2) for o in outs)}); alone "
                  f"{alone['ttft']:.2f} s; prefill choices per router {[choices(r) for r in rs]}")
            assert all(o["ids"] == alone["ids"] for o in outs)
            assert after - before <= 1.15 * PROMPT_TOKENS, f"{after - before} prompt tokens computed for {FANOUT}"
            # the first computes it all; the others reuse every page (those computed before they came:
            # device; those they waited for: inflight)
            assert cached == [(0, False)] + [(SHARED, True)] * (FANOUT - 1), cached
            if waited <= TTFT_RATIO * first["ttft"]:
                break
        else:
            pytest.fail(f"the slowest duplicate's TTFT was over {TTFT_RATIO}x the first's in {TTFT_ATTEMPTS} fan-outs")
    finally:
        for r in rs:
            r.stop()
