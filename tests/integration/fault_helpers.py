"""Helpers of the fault tests (test_faults_*.py): a router in front of a real worker cluster, the
router's view of its workers, and the "every survivor is healthy and sound" check after a scenario."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time

import httpx
import pytest

from engine.tokenizer import Tokenizer
from pdorch.local_stack.router import RouterThread, router_config
from pdorch.local_stack.workers import WorkerCluster, start_cluster
from proto.pdorch.v1 import worker_pb2 as pb


def prompt(n: int, seed: int = 0) -> list[int]:
    return [(seed * 7919 + i * 31) % 1000 + 10 for i in range(n)]


def start_fault_cluster(tmp, model_dir, num_prefill: int) -> WorkerCluster:
    """`num_prefill` prefill + 2 decode workers, tiny model, no store; prefill in chunks of 8 tokens
    so a long prompt keeps a prefill worker busy long enough to hit it mid-prefill."""
    c = start_cluster(tmp, model_dir, with_store=False, num_prefill=num_prefill, prefill={"chunk_tokens": 8})
    with c.stopped_on_failure():
        c.wait_ready(c.spawn_worker("decode"))
    return c


def fault_fixtures(name: str, num_prefill: int, **router_keys):
    """The module-scoped `cluster` (start_fault_cluster) and `router` (start_router with `router_keys`)
    fixtures of a fault test module: `cluster, router = fault_fixtures("faults_x", num_prefill=2, ...)`."""

    @pytest.fixture(scope="module")
    def cluster(tmp_path_factory, tiny_model_dir):
        c = start_fault_cluster(tmp_path_factory.mktemp(name), tiny_model_dir, num_prefill=num_prefill)
        yield c
        c.stop()

    @pytest.fixture(scope="module")
    def router(cluster, tiny_model_dir):
        r = start_router(cluster, tiny_model_dir, **router_keys)
        yield r
        r.stop()

    return cluster, router


def start_router(cluster, model_dir, **router_keys) -> RouterThread:
    """The real router app (in this process) over every worker of `cluster`, static discovery."""
    prefills = [w.address for w in cluster.workers if w.role == "prefill"]
    decodes = [w.address for w in cluster.workers if w.role == "decode"]
    base = router_config(prefills, decodes, **router_keys)
    cfg = dataclasses.replace(cluster.cfg, router=base.router, discovery=base.discovery)
    return RouterThread(cfg, Tokenizer.from_dir(model_dir), model_dir).start()


def router_workers(router) -> dict[str, dict]:
    """address -> the router's /workers entry (healthy, in_flight, routed, ...)."""
    return {w["address"]: w for w in httpx.get(router.url + "/workers", timeout=30).json()["workers"]}


def kill_serving_decode(router, cluster) -> None:
    """SIGKILL the decode worker (its process group) that serves the router's one stream in flight."""
    workers = router_workers(router)
    (serving,) = [w for w in cluster.workers if w.role == "decode" and w.proc.poll() is None
                  and workers[w.address]["in_flight"] == 1]
    os.killpg(serving.proc.pid, signal.SIGKILL)
    serving.proc.wait(10)


def iter_sse(lines):
    """The JSON events of an SSE stream's lines, as they arrive (the [DONE] line and blanks skipped)."""
    return (json.loads(ln[6:]) for ln in lines if ln.startswith("data: {"))


def sse_events(lines) -> list[dict]:
    return list(iter_sse(lines))


def worker_stats(cluster, wp) -> pb.WorkerStats:
    stub = cluster.prefill_stub(wp) if wp.role == "prefill" else cluster.decode_stub(wp)
    return stub.Stats(pb.StatsRequest(), timeout=30)


def assert_survivors_sound(cluster, timeout_s: float = 30.0) -> None:
    """Every worker process still alive answers, goes idle (no referenced pages) and passes
    check_integrity() with every page back in its pool (P's evictable L1 pages count as free)."""
    for wp in cluster.workers:
        if wp.proc.poll() is not None:
            continue
        deadline = time.monotonic() + timeout_s
        while True:
            st = worker_stats(cluster, wp)
            if st.active_pages == 0 and st.info.running_requests == 0 and st.info.queued_requests == 0:
                break
            assert time.monotonic() < deadline, f"{wp.role} {wp.address} still busy after {timeout_s}s: {st}"
            time.sleep(0.1)
        assert st.pool_integrity_ok, f"{wp.role} {wp.address} pool integrity: {st.pool_integrity_error}"
        assert st.info.free_pages == st.info.total_pages, f"{wp.role} {wp.address} leaked pages: {st.info}"


def wait_running(cluster, wps, timeout_s: float = 60.0):
    """The first of `wps` (prefill workers) that reports a request in progress."""
    deadline = time.monotonic() + timeout_s
    while True:
        for wp in wps:
            if worker_stats(cluster, wp).info.running_requests > 0:
                return wp
        assert time.monotonic() < deadline, "the request never reached a prefill worker"
        time.sleep(0.02)
