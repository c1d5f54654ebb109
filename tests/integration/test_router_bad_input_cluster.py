"""Inputs at the edge of what the router accepts, through to real workers (tiny model, store off):
widest sampling values, token ids at the vocabulary's ends, a prompt one token short of the context,
control characters, a request id used twice at once. Each is served (200) or refused with a 4xx;
the workers stay up and the decode worker's pages all come back."""

from __future__ import annotations

import dataclasses
import threading
import time

import httpx
import pytest

from engine.tokenizer import Tokenizer
from pdorch.local_stack.router import RouterThread, router_config
from pdorch.local_stack.workers import start_cluster

VOCAB = 49152
CONTEXT = 2048
INT32_MAX, INT64_MAX = 2**31 - 1, 2**63 - 1


def gen(ids=(5, 6, 7), **sampling) -> dict:
    return {"input_ids": list(ids), "sampling_params": {"max_new_tokens": 3, **sampling}}


EDGES = [
    ("top_k past the vocab", gen(top_k=INT32_MAX)),
    ("hottest temperature", gen(temperature=100.0)),
    ("smallest top_p", gen(top_p=1e-300)),
    ("tiny temperature", gen(temperature=1e-30)),
    ("largest seed", gen(seed=INT64_MAX)),
    ("smallest seed", gen(seed=-INT64_MAX - 1)),
    ("stop ids past the vocab", gen(stop_token_ids=[INT32_MAX, VOCAB + 5])),
    ("last token id", gen(ids=[VOCAB - 1] * 5)),
    ("token id 0", gen(ids=[0])),
    ("prompt one short of the context", gen(ids=[7] * (CONTEXT - 1), max_new_tokens=1)),
    ("prompt + output exactly the context", gen(ids=[7] * (CONTEXT - 48), max_new_tokens=48, ignore_eos=True)),
    ("NUL stop string", gen(stop=["\x00"])),
    ("16 long stop strings", gen(stop=["x" * 10000] * 16)),
    ("control characters in text", {"text": "\x00\x01\ufffd\u202e", "sampling_params": {"max_new_tokens": 2}}),
]


@pytest.fixture(scope="module")
def router(tmp_path_factory, tiny_model_dir):
    cluster = start_cluster(tmp_path_factory.mktemp("bad_input_cluster"), tiny_model_dir, with_store=False)
    try:
        base = router_config([cluster.workers[0].address], [cluster.decode.address], policy="round_robin",
                             admin_key="sk-admin")
        cfg = dataclasses.replace(cluster.cfg, router=base.router, discovery=base.discovery)
        r = RouterThread(cfg, Tokenizer.from_dir(tiny_model_dir), tiny_model_dir).start()
        try:
            yield r, cluster
        finally:
            r.stop()
    finally:
        cluster.stop()


def decode_free_pages(url: str) -> tuple[int, int]:
    workers = httpx.get(url + "/workers", headers={"Authorization": "Bearer sk-admin"}, timeout=10).json()["workers"]
    info = next(w["info"] for w in workers if w["role"] == "decode")
    return info["free_pages"], info["total_pages"]


@pytest.mark.parametrize("name,body", EDGES, ids=[e[0] for e in EDGES])
def test_edge_inputs_are_served_by_real_workers(router, name, body):
    r, cluster = router
    resp = httpx.post(r.url + "/generate", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert out["meta_info"]["completion_tokens"] == len(out["output_ids"]) >= 1
    assert all(0 <= t < VOCAB for t in out["output_ids"])
    assert all(w.proc.poll() is None for w in cluster.workers)


def test_a_request_id_used_twice_at_once_is_a_4xx_not_a_crash(router):
    r, cluster = router
    statuses = []

    def send():
        statuses.append(httpx.post(r.url + "/generate", timeout=120, json={
            "text": "hello there", "rid": "same-rid", "sampling_params": {"max_new_tokens": 40, "ignore_eos": True}}))

    threads = [threading.Thread(target=send) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    codes = sorted(resp.status_code for resp in statuses)
    assert len(codes) == 3 and codes[0] == 200 and all(c in (200, 400) for c in codes), codes
    for resp in statuses:
        if resp.status_code == 400:
            assert "'same-rid' is already running" in resp.json()["error"]["message"]
    # nothing is left allocated on the decode worker once every request ended
    deadline = time.monotonic() + 20
    while decode_free_pages(r.url)[0] != decode_free_pages(r.url)[1]:
        assert time.monotonic() < deadline, decode_free_pages(r.url)
        time.sleep(0.2)
    assert all(w.proc.poll() is None for w in cluster.workers)
