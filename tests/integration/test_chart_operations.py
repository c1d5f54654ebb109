"""Operating the chart on the network-namespace cluster (one namespace per pod, tests/fixtures/chart_cluster.py):

    (a) the rendered master command with master.extraArgs starts mooncake_master, which serves the store
    (b) a rolling replacement of the decode worker under streaming load (a new one registers, the old
        one gets SIGTERM: leaves etcd, drains, hands its streams to the new one mid-stream): every
        stream completes with the text of an uninterrupted run, no error
    (c) a router replaced under streaming load, with the rendered preStop hook then SIGTERM: the old
        router serves through the hook, finishes its streams, exits; no stream is cut
    (d) a worker token rotation in two rolling upgrades (both tokens accepted, then only the new one)
        with traffic flowing: no request fails, no Prefill or Generate is refused UNAUTHENTICATED

One module-scoped cluster with SmolLM2 (real text, so the hand-off is checked on real words): etcd,
mooncake_master, one prefill, one decode worker (a pure store client: its offloaded pages live in the
prefill worker's segment), one router. Each test leaves one healthy pod of each behind.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import grpc
import httpx
import pytest

from tests.fixtures.chart import render_chart
from tests.fixtures.chart_cluster import ChartCluster, Pod, sample, scrape, wait
from tests.fixtures.netns import netns_available

pytestmark = [pytest.mark.skipif(netns_available() is not None, reason=f"network namespaces: {netns_available()}"),
              pytest.mark.timeout(600)]

API_KEY, ADMIN_KEY = "ops-api-key", "ops-admin-key"
TOKEN_A, TOKEN_B = "ops-token-A-5e1c", "ops-token-B-93fa"
MAX_TOKENS = 40
PROMPTS = ["Write a short story about a lighthouse keeper and a storm.",
           "Describe a walk through an old forest in autumn.",
           "Explain how a bicycle gear system works to a child.",
           "Tell me about the history of the printing press."]


def _values(model_dir: Path, tmp: Path, **auth) -> dict:
    return {"config": {"model": {"source": str(model_dir), "cache_dir": str(tmp / "models"), "torch_threads": 1},
                       "store": {"global_segment_size_mb": 96},
                       "prefill": {"num_pages": 256},
                       # every prompt through the prefill worker; streams handed on after 1 s of drain
                       "decode": {"num_pages": 256, "max_running_requests": 8, "max_local_prefill_tokens": 0,
                                  "drain_timeout_s": 1.0},
                       "router": {"policy": "round_robin", "health_check_interval_s": 0.5},
                       "discovery": {"lease_ttl_s": 5}},
            # (a): the values file's own example
            "master": {"extraArgs": ["--offloading_queue_limit=100"]},
            # the decode worker stores nothing itself: a drained worker's pages outlive it
            "decode": {"extraEnv": [{"name": "PDORCH_STORE_GLOBAL_SEGMENT_SIZE_MB", "value": "0"}]},
            "router": {"preStopSleepSeconds": 2},
            "auth": {"apiKey": API_KEY, "adminKey": ADMIN_KEY, "grpcToken": TOKEN_A, **auth}}


@pytest.fixture(scope="module")
def ops(smollm2_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ops")
    cluster = ChartCluster(render_chart(_values(smollm2_dir, tmp)), tmp)
    cluster.values = lambda **auth: render_chart(_values(smollm2_dir, tmp, **auth))
    try:
        pods = cluster.add_initial_pods()
        for pod in pods:
            cluster.start(pod)
            if pod.component in ("etcd", "master"):
                cluster.wait_port(pod, pod.container["ports"][0]["name"], 30)
        router = cluster.of("router")[0]
        wait("router /health", lambda: httpx.get(router.url("http") + "/health", timeout=2).status_code == 200,
             240, pods)
        yield cluster
    finally:
        cluster.close()


# ------------------------------------------------------------------------------------------ clients
def _headers() -> dict:
    return {"Authorization": f"Bearer {API_KEY}"}


def _workers(router: Pod) -> list[dict]:
    r = httpx.get(router.url("http") + "/workers", timeout=5, headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    return r.json()["workers"]


def _healthy(router: Pod, pod: Pod) -> bool:
    return any(w["healthy"] and w["address"].startswith(pod.ip + ":") for w in _workers(router))


class Stream(threading.Thread):
    """One streamed chat completion; `chunks` grows as content arrives, `text`/`error` at the end."""

    def __init__(self, url: str, prompt: str):
        super().__init__(daemon=True)
        self.url, self.prompt = url, prompt
        self.chunks, self.text, self.error, self.finish = 0, "", None, None

    def run(self) -> None:
        body = {"stream": True, "temperature": 0, "max_tokens": MAX_TOKENS,
                "messages": [{"role": "user", "content": self.prompt}]}
        try:
            with httpx.stream("POST", self.url + "/v1/chat/completions", json=body, headers=_headers(),
                              timeout=120) as resp:
                if resp.status_code != 200:
                    self.error = f"HTTP {resp.status_code}: {resp.read()[:300]!r}"
                    return
                for line in resp.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:
                        self.error = event["error"]["message"]
                        return
                    if event["choices"]:
                        self.text += event["choices"][0]["delta"].get("content") or ""
                        self.finish = event["choices"][0]["finish_reason"] or self.finish
                        self.chunks += 1
        except httpx.HTTPError as e:
            self.error = repr(e)


def _streams(url: str, prompts=PROMPTS) -> list[Stream]:
    streams = [Stream(url, p) for p in prompts]
    for s in streams:
        s.start()
    return streams


def _finish(streams: list[Stream], timeout_s: float = 180.0) -> None:
    for s in streams:
        s.join(timeout_s)
        assert not s.is_alive(), f"stream {s.prompt!r} did not end"


def _reference(url: str) -> dict[str, str]:
    streams = _streams(url)
    _finish(streams)
    assert all(s.error is None and s.finish == "length" for s in streams), [s.error for s in streams]
    return {s.prompt: s.text for s in streams}


def _roll(cluster: ChartCluster, component: str, router: Pod, before_stop=lambda old: None) -> None:
    """A surge rollout step: a new pod from the current objects, ready (registered, healthy in the
    router) before the old one is terminated (`before_stop(old)` just before)."""
    old = cluster.of(component)[0]
    new = cluster.start(cluster.add_pod(component))
    wait(f"{new.name} healthy in the router", lambda: _healthy(router, new), 180, [new, old, router])
    before_stop(old)
    rc, _ = cluster.terminate(old)
    assert rc == 0, f"{old.name} exited {rc}"


# -------------------------------------------------------------------------------------------- tests
def test_a_master_runs_with_extra_args_and_serves_the_store(ops):
    master = ops.of("master")[0]
    cmdline = Path(f"/proc/{master.proc.pid}/cmdline").read_bytes().split(b"\0")
    assert cmdline[0].endswith(b"mooncake_master") and b"--offloading_queue_limit=100" in cmdline
    assert "master_key_count" in httpx.get(master.url("metrics") + "/metrics", timeout=5).text
    router = ops.of("router")[0]
    r = httpx.post(router.url("http") + "/v1/chat/completions", headers=_headers(), timeout=120,
                   json={"messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": 24, "temperature": 0})
    assert r.status_code == 200, r.text
    for worker in ops.of("prefill") + ops.of("decode"):
        assert sample(worker.url("metrics") + "/metrics", "pdorch_store_enabled") == 1.0, worker.name
    written = scrape(ops.of("prefill")[0].url("metrics") + "/metrics")["pdorch_store_pages_written_total"]
    assert written > 0


def test_b_decode_rolling_replacement_hands_streams_on_without_an_error(ops):
    router = ops.of("router")[0]
    url = router.url("http")
    reference = _reference(url)
    metrics = router.url("metrics") + "/metrics"
    resumed_before = sample(metrics, "pdorch_router_failovers_total", outcome="resumed")
    old = ops.of("decode")[0]
    new = ops.start(ops.add_pod("decode"))  # maxSurge 1: the new pod first
    wait(f"{new.name} healthy", lambda: _healthy(router, new), 180, [new, old])
    streams = _streams(url)
    wait("every stream under way", lambda: all(s.chunks >= 4 or not s.is_alive() for s in streams), 120)
    served_by_old = next(w for w in _workers(router) if w["address"].startswith(old.ip + ":"))["in_flight"]
    rc, took = ops.terminate(old)  # leaves etcd, 1 s of drain, hands the rest on, exits
    late = _streams(url, PROMPTS[:2])  # requests during and after the drain go to the new worker
    _finish(streams + late)
    assert rc == 0 and took < 30, (rc, took)
    for s in streams + late:
        assert s.error is None, s.error
        assert s.text == reference[s.prompt] and s.finish == "length", (s.prompt, s.text, reference[s.prompt])
    handed_on = sample(metrics, "pdorch_router_failovers_total", outcome="resumed") - resumed_before
    assert 1 <= handed_on <= served_by_old, (handed_on, served_by_old)  # mid-stream, to the new worker
    assert sample(metrics, "pdorch_router_failovers_total", outcome="failed") == 0
    assert "handing" in (ops.tmp / f"{old.name}.log").read_text()


def test_c_router_replaced_with_prestop_and_drain_cuts_no_stream(ops):
    old = ops.of("router")[0]
    reference = _reference(old.url("http"))
    new = ops.start(ops.add_pod("router"))  # maxSurge 1: the new router is ready first
    wait(f"{new.name} /health", lambda: httpx.get(new.url("http") + "/health", timeout=2).status_code == 200,
         120, [new])
    streams = _streams(old.url("http"))
    wait("every stream under way", lambda: all(s.chunks >= 2 or not s.is_alive() for s in streams), 120)
    outcome = {}
    stopper = threading.Thread(target=lambda: outcome.update(zip(("rc", "took"), ops.terminate(old))), daemon=True)
    stopper.start()
    time.sleep(0.5)  # the preStop hook sleeps: the pod still serves what reaches it before it leaves the endpoints
    during_hook = _streams(old.url("http"), PROMPTS[:1])
    after = _streams(new.url("http"), PROMPTS[1:2])  # new connections go to the new router
    _finish(streams + during_hook + after)
    stopper.join(120)
    # NOTE: uvicorn re-raises the SIGTERM it handled once its graceful shutdown is over (exit 143 in a pod)
    assert outcome.get("rc") == -signal.SIGTERM, outcome
    log = (ops.tmp / f"{old.name}.log").read_text()
    assert "Waiting for connections to close" in log and "Finished server process" in log
    assert outcome["took"] >= 2  # the hook ran first
    for s in streams + during_hook + after:
        assert s.error is None, s.error
        assert s.text == reference[s.prompt] and s.finish == "length", s.prompt
    with pytest.raises(httpx.ConnectError):  # gone, after its last stream
        httpx.get(old.url("http") + "/health", timeout=2)


class Traffic(threading.Thread):
    """Short non-streamed requests back to back through `self.router` (switched by the test)."""

    def __init__(self, router: Pod):
        super().__init__(daemon=True)
        self.router, self.stop, self.outcomes = router, threading.Event(), []

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            i += 1
            body = {"messages": [{"role": "user", "content": f"Count to {i % 7 + 2}."}], "max_tokens": 4}
            try:
                r = httpx.post(self.router.url("http") + "/v1/chat/completions", json=body, headers=_headers(),
                               timeout=60)
                self.outcomes.append((r.status_code, r.text[:200]))
            except httpx.HTTPError as e:
                self.outcomes.append((None, repr(e)))


def _refusals(pod: Pod) -> dict[str, float]:
    """UNAUTHENTICATED refusals of the worker's request RPC and of Info, from its own metrics."""
    url, name = pod.url("metrics") + "/metrics", f"pdorch_{pod.component}_grpc_unauthenticated_total"
    request = "Prefill" if pod.component == "prefill" else "Generate"
    return {"request": sample(url, name, method=request), "Info": sample(url, name, method="Info")}


def test_d_token_rotation_in_two_steps_refuses_nothing(ops):
    traffic = Traffic(ops.of("router")[0])
    traffic.start()
    refusals: dict[str, dict[str, float]] = {}  # pod -> its counts, read just before it stopped

    def record(pod: Pod) -> None:
        refusals[pod.name] = _refusals(pod)

    try:
        wait("traffic flowing", lambda: len(traffic.outcomes) >= 3, 60)
        for step, auth in ((1, {"grpcToken": TOKEN_B, "grpcPreviousToken": TOKEN_A}), (2, {"grpcToken": TOKEN_B})):
            ops.set_objects(ops.values(**auth))
            for component in ("decode", "prefill"):  # the new decode worker meets the old prefill worker
                _roll(ops, component, ops.of("router")[0], record)
            old_router = ops.of("router")[0]
            new_router = ops.start(ops.add_pod("router"))
            wait("the new router healthy",
                 lambda r=new_router: httpx.get(r.url("http") + "/health", timeout=2).status_code == 200, 120)
            traffic.router = new_router
            assert ops.terminate(old_router)[0] == -signal.SIGTERM  # after its graceful shutdown (test c)
            n = len(traffic.outcomes)
            wait(f"traffic after step {step}", lambda n=n: len(traffic.outcomes) >= n + 3, 60)
        for pod in ops.of("prefill") + ops.of("decode"):
            record(pod)
    finally:
        traffic.stop.set()
        traffic.join(90)
    bad = [o for o in traffic.outcomes if o[0] != 200]
    assert not bad and len(traffic.outcomes) > 10, bad[:5]
    assert sum(c["request"] for c in refusals.values()) == 0, refusals  # no Prefill, no Generate refused
    assert sum(c["Info"] for c in refusals.values()) > 0, refusals  # how step 1's decode worker learnt
    _check_only_the_new_token_works(ops.of("decode")[0])


def _check_only_the_new_token_works(decode: Pod) -> None:
    from proto.pdorch.v1 import worker_pb2 as pb
    from proto.pdorch.v1 import worker_pb2_grpc as pb_grpc
    with grpc.insecure_channel(f"{decode.ip}:{decode.port('grpc')}") as channel:
        stub = pb_grpc.DecodeServiceStub(channel)
        with pytest.raises(grpc.RpcError) as old:
            stub.Info(pb.InfoRequest(), timeout=10, metadata=[("authorization", f"Bearer {TOKEN_A}")])
        assert old.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert stub.Info(pb.InfoRequest(), timeout=10, metadata=[("authorization", f"Bearer {TOKEN_B}")]).role == \
            "decode"
