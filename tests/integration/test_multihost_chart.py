"""The chart's rendered objects drive a real multi-host cluster: one network namespace per pod.

etcd, mooncake_master, the router, two prefill and one decode worker each run in their own Linux
network namespace with their own address on a private subnet, started from exactly what the chart
renders: each container's command and args, its env (downward-API pod IP, Secret keys), the
ConfigMap mounted where the pod mounts it, and Service names resolving as cluster DNS would. Then:
etcd discovery, the store and the transfer engine across hosts, a chat answered, a second turn
read from the store by the OTHER prefill worker, and nothing listening on or advertising loopback.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from pdorch.planner.planner_metrics import PlannerMetrics
from tests.fixtures.chart import FULLNAME, find, render_chart
from tests.fixtures.chart_cluster import ChartCluster, Pod, scrape, wait
from tests.fixtures.netns import netns_available

pytestmark = [pytest.mark.skipif(netns_available() is not None, reason=f"network namespaces: {netns_available()}"),
              pytest.mark.timeout(300)]

API_KEY = "multihost-api-key"


def _values(model_dir: Path, tmp: Path) -> dict:
    return {"config": {"model": {"source": str(model_dir), "cache_dir": str(tmp / "models"), "torch_threads": 1},
                       "store": {"global_segment_size_mb": 64},
                       # every turn through a prefill worker (no conditional disaggregation): the
                       # second turn's prefill worker must read the first one's pages across hosts
                       "prefill": {"num_pages": 128},
                       "decode": {"num_pages": 128, "max_running_requests": 4, "max_local_prefill_tokens": 0},
                       # round robin: the second turn goes to the other prefill worker, so its prefix
                       # can only come from the store (across hosts), not from an L1
                       "router": {"policy": "round_robin"}},
            "prefill": {"replicas": 2}, "decode": {"replicas": 1},
            "master": {"replicas": 2},  # HA masters: a leader elected in the chart's etcd
            "auth": {"apiKey": API_KEY, "adminKey": "multihost-admin-key", "grpcToken": "multihost-grpc-token"},
            "monitoring": {"prometheusRule": {"enabled": True}, "grafanaDashboard": {"enabled": True}}}


def _chat(url: str, messages: list[dict]) -> dict:
    r = httpx.post(f"{url}/v1/chat/completions", timeout=60, headers={"Authorization": f"Bearer {API_KEY}"},
                   json={"messages": messages, "max_tokens": 12, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def test_rendered_chart_runs_across_network_namespaces(tiny_model_dir, tmp_path):
    objects = render_chart(_values(tiny_model_dir, tmp_path))
    cluster = ChartCluster(objects, tmp_path)
    try:
        pods = cluster.add_initial_pods()
        assert [p.component for p in pods].count("prefill") == 2
        for pod in pods:
            cluster.start(pod)
            if pod.component == "etcd":  # infrastructure first; the rest start together
                cluster.wait_port(pod, "client", 30)
            elif pod.component == "master":  # NOTE: a standby opens its RPC port only when it leads
                cluster.wait_port(pod, "metrics", 30)
        router = cluster.of("router")[0]
        url = router.url("http")
        wait("router /health", lambda: httpx.get(f"{url}/health", timeout=2).status_code == 200, 180, pods)
        wait("both prefill workers known", lambda: _healthy(url, "prefill") == 2, 60, pods)

        first = [{"role": "user", "content": "Tell me about network namespaces and why pods need them."}]
        one = _chat(url, first)
        answer = one["choices"][0]["message"]["content"]
        assert one["usage"]["completion_tokens"] > 0
        second = first + [{"role": "assistant", "content": answer},
                          {"role": "user", "content": "And what about bridges?"}]

        def written_back() -> float:
            return sum(scrape(p.url("metrics") + "/metrics").get("pdorch_store_pages_written_total", 0)
                       for p in cluster.of("prefill"))
        # NOTE: every full page of turn 1's prompt, not just the first to land: the check after the leader's
        # kill expects them in the store, so they must be there before it (one CI run killed it too early).
        full_pages = one["usage"]["prompt_tokens"] // 16  # config.model.page_size's default
        wait("turn 1's write-back", lambda: written_back() >= full_pages, 30, pods)
        # Every worker's L1 goes (the decode worker's own cache too): turn 2 can only find its prefix in the store.
        flushed = httpx.post(f"{url}/flush_cache", timeout=30, headers={"Authorization": "Bearer multihost-admin-key"})
        assert flushed.status_code == 200, flushed.text
        two = _chat(url, second)
        cached = two["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached >= 16, two["usage"]

        scraped = {p.name: scrape(p.url("metrics") + "/metrics") for p in cluster.of("prefill")}
        read = [m.get("pdorch_store_pages_read_total", 0) for m in scraped.values()]
        written = [m.get("pdorch_store_pages_written_total", 0) for m in scraped.values()]
        assert sum(written) > 0 and sum(read) > 0, (read, written)  # one wrote, the other read across hosts

        _check_dashboard_and_alert_metrics_exist(objects, cluster)
        _check_workers_refuse_calls_without_the_token(cluster.of("prefill")[0])
        _check_nothing_on_loopback(cluster)
        _check_registrations(cluster)
        _check_a_killed_leader_loses_no_stored_prefix(cluster, url, second + [
            {"role": "assistant", "content": two["choices"][0]["message"]["content"]},
            {"role": "user", "content": "And veth pairs?"}], two["usage"]["prompt_tokens"], pods)
    finally:
        cluster.close()


def _healthy(url: str, role: str) -> int:
    r = httpx.get(f"{url}/workers", timeout=3, headers={"Authorization": "Bearer multihost-admin-key"})
    return sum(1 for w in r.json()["workers"] if w["role"] == role and w.get("healthy"))


def _check_dashboard_and_alert_metrics_exist(objects, cluster: ChartCluster) -> None:
    """Every series the dashboard and the alerts query is exported by some component (the router's on
    its own metrics port, as Prometheus scrapes it)."""
    exported = set()
    for pod in cluster.pods.values():
        if any(p["name"] == "metrics" for p in pod.container["ports"]):
            exported |= set(scrape(pod.url("metrics") + "/metrics"))
    # the planner is off in this release (no pod): its series are the ones its own registry declares
    planner = CollectorRegistry()
    PlannerMetrics(planner, attainment_window=1)
    for family in planner.collect():
        exported |= {family.name, f"{family.name}_total"} if family.type == "counter" else {family.name}
    dashboard = find(objects, "ConfigMap", f"{FULLNAME}-dashboard")["data"]["pdorch.json"]
    rules = " ".join(r["expr"] for g in find(objects, "PrometheusRule", FULLNAME)["spec"]["groups"] for r in g["rules"])
    queried = set(re.findall(r"\b((?:pdorch|master)_[a-z0-9_]+)", dashboard + rules))
    assert len(queried) >= 10
    assert queried <= exported, f"queried but exported by no component: {sorted(queried - exported)}"


def _check_workers_refuse_calls_without_the_token(worker: Pod) -> None:
    import grpc

    from proto.pdorch.v1 import worker_pb2 as pb
    from proto.pdorch.v1 import worker_pb2_grpc as pb_grpc
    with grpc.insecure_channel(f"{worker.ip}:{worker.port('grpc')}") as channel, \
            pytest.raises(grpc.RpcError) as refused:
        pb_grpc.PrefillServiceStub(channel).Info(pb.InfoRequest(), timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


def _check_nothing_on_loopback(cluster: ChartCluster) -> None:
    for pod in cluster.pods.values():
        listening = [line.split()[3] for line in cluster.lab.exec(pod.host, ["ss", "-ltnH"]).splitlines()
                     if line.strip()]
        assert listening, f"{pod.name} listens on nothing"
        loopback = [a for a in listening if a.startswith(("127.", "[::1]", "localhost"))]
        assert not loopback, f"{pod.name} ({pod.component}) listens on loopback: {loopback}"


def _check_registrations(cluster: ChartCluster) -> None:
    import etcd3
    client = etcd3.client(host=cluster.of("etcd")[0].ip, port=2379, timeout=5)
    try:
        values = [json.loads(v) for v, _ in client.get_prefix("/pdorch/workers/")]
    finally:
        client.close()
    workers = {p.name: p.ip for p in cluster.pods.values() if p.component in ("prefill", "decode")}
    assert len(values) == len(workers), values
    text = json.dumps(values)
    assert "127.0.0.1" not in text and "localhost" not in text and "0.0.0.0" not in text, text
    advertised = {v["address"].rsplit(":", 1)[0] for v in values}
    segments = {v["info"]["transfer_segment"].rsplit(":", 1)[0] for v in values}
    assert advertised == segments == set(workers.values())


def _role(master: Pod) -> str:
    return httpx.get(master.url("metrics") + "/role", timeout=3).text.strip()


def _check_a_killed_leader_loses_no_stored_prefix(cluster: ChartCluster, url: str, third: list[dict],
                                                  stored_tokens: int, pods) -> None:
    """SIGKILL the leading master pod: the standby leads, every worker's store comes back through
    etcd, and the next turn reads its prefix (turn 2's prompt, `stored_tokens`, written before the
    kill) from the store."""
    masters = cluster.of("master")
    assert sorted(_role(m) for m in masters) == ["leader", "standby"]
    leader = next(m for m in masters if _role(m) == "leader")
    standby = next(m for m in masters if m is not leader)
    leader.proc.kill()
    leader.proc.wait(10)
    others = [p for p in pods if p is not leader]
    wait("the standby to lead", lambda: _role(standby) == "leader", 60, others)
    workers = cluster.of("prefill") + cluster.of("decode")

    def reconnected() -> bool:
        m = [scrape(w.url("metrics") + "/metrics") for w in workers]
        return all(x.get("pdorch_store_master_leader_changes_total", 0) >= 1 and x.get("pdorch_store_enabled") == 1
                   for x in m)
    wait("every worker's store through the new leader", reconnected, 60, others)
    flushed = httpx.post(f"{url}/flush_cache", timeout=30, headers={"Authorization": "Bearer multihost-admin-key"})
    assert flushed.status_code == 200, flushed.text
    three = _chat(url, third)
    details = three["usage"]["prompt_tokens_details"]
    page = 16  # config.model.page_size's default
    assert details["cached_tokens"] >= max(32, stored_tokens // page * page - page), (stored_tokens, three["usage"])
