"""The chart's rendered objects drive a real multi-host cluster: one network namespace per pod.

etcd, mooncake_master, the router, two prefill and one decode worker each run in their own Linux
network namespace with their own address on a private subnet, started from exactly what the chart
renders: each container's command and args, its env (downward-API pod IP, Secret keys), the
ConfigMap mounted where the pod mounts it, and Service names resolving as cluster DNS would. Then:
etcd discovery, the store and the transfer engine across hosts, a chat answered, a second turn
read from the store by the OTHER prefill worker, and nothing listening on or advertising loopback.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.fixtures.chart import FULLNAME, NAMESPACE, containers, find, render_chart
from tests.fixtures.netns import NetnsLab, netns_available

pytestmark = [pytest.mark.skipif(netns_available() is not None, reason=f"network namespaces: {netns_available()}"),
              pytest.mark.timeout(300)]

API_KEY = "multihost-api-key"
EXECUTABLES = {"python": sys.executable, "pdorch": str(Path(sys.executable).parent / "pdorch"),
               "etcd": shutil.which("etcd") or "etcd"}
START_ORDER = ("etcd", "master", "prefill", "decode", "router")


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
            "auth": {"apiKey": API_KEY, "adminKey": "multihost-admin-key", "grpcToken": "multihost-grpc-token"},
            "monitoring": {"prometheusRule": {"enabled": True}, "grafanaDashboard": {"enabled": True}}}


def _pods(objects: list[dict]) -> list[tuple[str, str, dict]]:
    """(pod name, component, workload) for every replica, in start order."""
    pods = []
    for obj in objects:
        if obj["kind"] not in ("Deployment", "StatefulSet"):
            continue
        component = obj["metadata"]["labels"]["app.kubernetes.io/component"]
        for i in range(obj["spec"].get("replicas", 1)):
            pods.append((f"{obj['metadata']['name']}-{i}", component, obj))
    return sorted(pods, key=lambda p: START_ORDER.index(p[1]))


def _dns(objects: list[dict], pod_ips: dict[str, str], pods) -> dict[str, str]:
    """What cluster DNS answers: Service names -> the IP of a pod they select; StatefulSet pod names."""
    names = {}
    for svc in (o for o in objects if o["kind"] == "Service"):
        sel = svc["spec"]["selector"]
        backing = [name for name, _, w in pods if sel.items() <= w["spec"]["template"]["metadata"]["labels"].items()]
        name = svc["metadata"]["name"]
        for alias in (name, f"{name}.{NAMESPACE}.svc", f"{name}.{NAMESPACE}.svc.cluster.local"):
            names[alias] = pod_ips[backing[0]]
        if svc["spec"].get("clusterIP") == "None":
            for pod in backing:
                names[f"{pod}.{name}.{NAMESPACE}.svc"] = pod_ips[pod]
    return names


def _container_env(c: dict, pod: str, ip: str, secret: dict) -> dict[str, str]:
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
            continue
        src = e["valueFrom"]
        if "fieldRef" in src:
            env[e["name"]] = {"status.podIP": ip, "metadata.name": pod}[src["fieldRef"]["fieldPath"]]
        else:
            ref = src["secretKeyRef"]
            env[e["name"]] = base64.b64decode(secret["data"][ref["key"]]).decode()
    return env


def _argv(c: dict, env: dict[str, str], mounts: dict[str, Path]) -> list[str]:
    argv = []
    for arg in c["command"] + c.get("args", []):
        arg = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], arg)
        for mount, local in mounts.items():
            arg = arg.replace(mount, str(local))
        argv.append(arg)
    argv[0] = EXECUTABLES.get(argv[0], argv[0])
    return argv


def _mounts(obj: dict, c: dict, root: Path, configmap: dict) -> dict[str, Path]:
    """The pod's volumes as local dirs: the ConfigMap's files, emptyDirs; /dev mounts are the host's."""
    volumes = {v["name"]: v for v in obj["spec"]["template"]["spec"].get("volumes", [])}
    mounts = {}
    for m in c.get("volumeMounts", []):
        if m["mountPath"].startswith("/dev"):
            continue
        local = root / m["mountPath"].strip("/")
        local.mkdir(parents=True, exist_ok=True)
        if "configMap" in volumes.get(m["name"], {}):
            for key, text in configmap["data"].items():
                (local / key).write_text(text)
        mounts[m["mountPath"]] = local
    return mounts


def _wait(what: str, check, timeout_s: float, procs) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        dead = [(name, p.returncode) for name, p in procs.items() if p.poll() is not None]
        assert not dead, f"died while waiting for {what}: {dead}"
        try:
            if check():
                return
        except (httpx.HTTPError, OSError):
            pass
        time.sleep(0.3)
    raise TimeoutError(f"{what} not within {timeout_s}s")


def _metrics(url: str) -> dict[str, float]:
    text = httpx.get(url, timeout=5).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):  # a family with no samples yet (a labelled counter never hit)
            _, _, name, kind = line.split()[:4]
            for suffix in {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}.get(kind, ("",)):
                out.setdefault(name.removesuffix("_total") + suffix, 0.0)
        elif line and not line.startswith("#"):
            name = re.split(r"[{ ]", line, maxsplit=1)[0]
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def _chat(url: str, messages: list[dict]) -> dict:
    r = httpx.post(f"{url}/v1/chat/completions", timeout=60, headers={"Authorization": f"Bearer {API_KEY}"},
                   json={"messages": messages, "max_tokens": 12, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def test_rendered_chart_runs_across_network_namespaces(tiny_model_dir, tmp_path):
    objects = render_chart(_values(tiny_model_dir, tmp_path))
    configmap = find(objects, "ConfigMap", f"{FULLNAME}-config")
    secret = find(objects, "Secret", f"{FULLNAME}-keys")
    pods = _pods(objects)
    assert [c for _, c, _ in pods].count("prefill") == 2
    lab = NetnsLab()
    procs = {}
    try:
        ips = {name: lab.add_host(name.removeprefix(f"{FULLNAME}-")) for name, _, _ in pods}
        lab.set_hosts(_dns(objects, ips, pods))
        for name, component, obj in pods:
            c = containers(obj)[0]
            env = _container_env(c, name, ips[name], secret)
            argv = _argv(c, env, _mounts(obj, c, tmp_path / name, configmap))
            procs[name] = lab.spawn(name.removeprefix(f"{FULLNAME}-"), argv, env, tmp_path / f"{name}.log")
            if component in ("etcd", "master"):  # infrastructure first; the rest start together
                port = c["ports"][0]["containerPort"]
                _wait(f"{name} port", lambda ip=ips[name], p=port: _connects(ip, p), 30, procs)
        router = next(n for n, c, _ in pods if c == "router")
        port = containers(find(objects, "Deployment", f"{FULLNAME}-router"))[0]["ports"][0]["containerPort"]
        url = f"http://{ips[router]}:{port}"
        _wait("router /health", lambda: httpx.get(f"{url}/health", timeout=2).status_code == 200, 180, procs)
        _wait("both prefill workers known", lambda: _healthy(url, "prefill") == 2, 60, procs)

        first = [{"role": "user", "content": "Tell me about network namespaces and why pods need them."}]
        one = _chat(url, first)
        answer = one["choices"][0]["message"]["content"]
        assert one["usage"]["completion_tokens"] > 0
        second = first + [{"role": "assistant", "content": answer},
                          {"role": "user", "content": "And what about bridges?"}]
        two = _chat(url, second)
        cached = two["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached >= 16, two["usage"]

        prefill = [n for n, c, _ in pods if c == "prefill"]
        metrics_port = containers(find(objects, "Deployment", f"{FULLNAME}-prefill"))[0]["ports"][1]["containerPort"]
        scraped = {n: _metrics(f"http://{ips[n]}:{metrics_port}/metrics") for n in prefill}
        read = [scraped[n].get("pdorch_store_pages_read_total", 0) for n in prefill]
        written = [scraped[n].get("pdorch_store_pages_written_total", 0) for n in prefill]
        assert sum(written) > 0 and sum(read) > 0, (read, written)  # one wrote, the other read across hosts

        _check_dashboard_and_alert_metrics_exist(objects, pods, ips, url)
        _check_workers_refuse_calls_without_the_token(objects, ips, prefill[0])
        _check_nothing_on_loopback(lab, pods, ips)
        _check_registrations(ips, pods)
    finally:
        lab.close()
        for name in procs:
            log = tmp_path / f"{name}.log"
            if log.exists():
                print(f"--- {name} ---\n" + log.read_text()[-1500:])


def _connects(ip: str, port: int) -> bool:
    import socket
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((ip, port)) == 0


def _healthy(url: str, role: str) -> int:
    r = httpx.get(f"{url}/workers", timeout=3, headers={"Authorization": "Bearer multihost-admin-key"})
    return sum(1 for w in r.json()["workers"] if w["role"] == role and w.get("healthy"))


def _check_dashboard_and_alert_metrics_exist(objects, pods, ips, router_url) -> None:
    """Every series the dashboard and the alerts query is exported by some component."""
    exported = set(_metrics(f"{router_url}/metrics"))
    for name, _, obj in pods:
        for port in containers(obj)[0]["ports"]:
            if port["name"] == "metrics":
                exported |= set(_metrics(f"http://{ips[name]}:{port['containerPort']}/metrics"))
    dashboard = find(objects, "ConfigMap", f"{FULLNAME}-dashboard")["data"]["pdorch.json"]
    rules = json.dumps(find(objects, "PrometheusRule", FULLNAME)["spec"])
    queried = set(re.findall(r"\b((?:pdorch|master)_[a-z0-9_]+)", dashboard + rules))
    assert len(queried) >= 10
    assert queried <= exported, f"queried but exported by no component: {sorted(queried - exported)}"


def _check_workers_refuse_calls_without_the_token(objects, ips, worker: str) -> None:
    import grpc

    from proto.pdorch.v1 import worker_pb2 as pb
    from proto.pdorch.v1 import worker_pb2_grpc as pb_grpc
    port = containers(find(objects, "Deployment", f"{FULLNAME}-prefill"))[0]["ports"][0]["containerPort"]
    with grpc.insecure_channel(f"{ips[worker]}:{port}") as channel, pytest.raises(grpc.RpcError) as refused:
        pb_grpc.PrefillServiceStub(channel).Info(pb.InfoRequest(), timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


def _check_nothing_on_loopback(lab: NetnsLab, pods, ips) -> None:
    for name, component, _ in pods:
        host = name.removeprefix(f"{FULLNAME}-")
        listening = [line.split()[3] for line in lab.exec(host, ["ss", "-ltnH"]).splitlines() if line.strip()]
        assert listening, f"{name} listens on nothing"
        loopback = [a for a in listening if a.startswith(("127.", "[::1]", "localhost"))]
        assert not loopback, f"{name} ({component}) listens on loopback: {loopback}"


def _check_registrations(ips, pods) -> None:
    import etcd3
    etcd_ip = next(ips[n] for n, c, _ in pods if c == "etcd")
    client = etcd3.client(host=etcd_ip, port=2379, timeout=5)
    try:
        values = [json.loads(v) for v, _ in client.get_prefix("/pdorch/workers/")]
    finally:
        client.close()
    workers = {n: ips[n] for n, c, _ in pods if c in ("prefill", "decode")}
    assert len(values) == len(workers), values
    text = json.dumps(values)
    assert "127.0.0.1" not in text and "localhost" not in text and "0.0.0.0" not in text, text
    advertised = {v["address"].rsplit(":", 1)[0] for v in values}
    segments = {v["info"]["transfer_segment"].rsplit(":", 1)[0] for v in values}
    assert advertised == segments == set(workers.values())
