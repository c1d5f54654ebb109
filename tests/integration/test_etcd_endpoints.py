"""A real 3-member etcd: when the member a worker or a router talks to dies, they go on through another.

Before, both kept the first endpoint that answered: the worker's lease refreshes failed until its
registration expired (the router dropped a healthy worker), and the router's resyncs failed forever
(it never saw a worker registered after the member died).
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import time

import httpx
import pytest

from pdorch.config import DiscoveryConfig
from pdorch.local_stack.processes import free_port, stop_process, wait_for_port
from pdorch.local_stack.router import router_config, wait_until
from pdorch.worker.registration import WorkerRegistration, connect, worker_key

TTL_S = 2
MEMBERS = ("m0", "m1", "m2")


@pytest.fixture
def etcd_cluster(tmp_path):
    """Three etcd members on loopback: {name: (client endpoint, process)}; stopped by PID."""
    binary = shutil.which("etcd")
    if binary is None:
        pytest.fail("the `etcd` binary is not installed (make setup installs Debian's etcd-server)")
    ports = {m: (free_port(), free_port()) for m in MEMBERS}
    initial = ",".join(f"{m}=http://127.0.0.1:{peer}" for m, (_, peer) in ports.items())
    members = {}
    try:
        for m, (client, peer) in ports.items():
            with open(tmp_path / f"{m}.log", "wb") as log:
                proc = subprocess.Popen(
                    [binary, "--name", m, "--data-dir", str(tmp_path / m),
                     "--listen-client-urls", f"http://127.0.0.1:{client}",
                     "--advertise-client-urls", f"http://127.0.0.1:{client}",
                     "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                     "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                     "--initial-cluster", initial, "--initial-cluster-state", "new"],
                    stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
            members[m] = (f"127.0.0.1:{client}", proc)
        for endpoint, proc in members.values():
            wait_for_port(int(endpoint.rsplit(":", 1)[1]), 20, proc)
        wait_until(lambda: _healthy(members["m2"][0]), 20, "the 3-member etcd cluster to elect a leader")
        yield members
    finally:
        for _, proc in members.values():
            stop_process(proc)


def _healthy(endpoint: str) -> bool:
    try:
        return httpx.get(f"http://{endpoint}/health", timeout=2).json().get("health") == "true"
    except (httpx.HTTPError, ValueError):
        return False


def _disc(members, *names: str) -> DiscoveryConfig:
    return DiscoveryConfig(mode="etcd", etcd_endpoints=tuple(members[n][0] for n in names), cluster="t",
                           lease_ttl_s=TTL_S)


def test_worker_and_router_move_to_another_member_when_theirs_dies(etcd_cluster, standins, make_router):
    members = etcd_cluster
    p, d = standins("prefill"), standins("decode")
    reg = WorkerRegistration(_disc(members, *MEMBERS), "prefill", "p-1", p.address).start()
    cfg = dataclasses.replace(router_config([], [], policy="round_robin"), discovery=_disc(members, *MEMBERS))
    r = make_router([], [], cfg=cfg)
    later = None
    try:
        assert reg._client.endpoint == members["m0"][0]  # both use the first endpoint until it fails
        wait_until(lambda: len(r.app.state.pool.workers("prefill")) == 1, 10, "the router to see p-1")
        stop_process(members["m0"][1])
        time.sleep(TTL_S * 3)  # several lease periods with m0 gone
        survivor = connect([members["m1"][0]])
        try:
            assert survivor.get(worker_key("t", "prefill", "p-1"))[0] is not None, "p-1's registration expired"
        finally:
            survivor.close()
        assert [w.address for w in r.app.state.pool.workers("prefill")] == [p.address]
        # a worker registered after m0 died reaches the router through another member
        later = WorkerRegistration(_disc(members, "m1", "m2"), "decode", "d-1", d.address).start()
        wait_until(lambda: len(r.app.state.pool.workers("decode")) == 1, 20,
                   "the router to see a registration made after its etcd member died")
        with httpx.Client(base_url=r.url, timeout=20) as c:
            wait_until(lambda: c.get("/health").status_code == 200, 10, "a healthy pair")
            body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}
            assert c.post("/generate", json=body).status_code == 200
    finally:
        reg.stop()
        if later is not None:
            later.stop()
