"""Real etcd: worker registration lives exactly as long as its owner, and the router's watch follows it."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
import time

import httpx

from pdorch.config import DiscoveryConfig
from pdorch.local_stack.processes import stop_process
from pdorch.local_stack.router import router_config, wait_until
from pdorch.worker.registration import WorkerRegistration, connect, worker_key

TTL_S = 2


def _disc(etcd, **kw) -> DiscoveryConfig:
    return DiscoveryConfig(mode="etcd", etcd_endpoints=(etcd.endpoint,), cluster="t", lease_ttl_s=TTL_S, **kw)




def test_registration_is_kept_alive_and_removed_on_stop(etcd_server):
    client = connect([etcd_server.endpoint])
    key = worker_key("t", "prefill", "p-1")
    reg = WorkerRegistration(_disc(etcd_server), "prefill", "p-1", "127.0.0.1:5001", {"page_size": 16}).start()
    try:
        value, _ = client.get(key)
        assert json.loads(value) == {"address": "127.0.0.1:5001", "role": "prefill", "worker_id": "p-1",
                                     "info": {"page_size": 16}}
        time.sleep(TTL_S * 2.5)  # several lease periods: the keep-alive thread must be renewing
        assert client.get(key)[0] is not None
    finally:
        reg.stop()
    assert client.get(key)[0] is None  # revoked at once, not at lease expiry
    client.close()


def test_registration_of_a_killed_process_disappears_within_the_lease_ttl(etcd_server, tmp_path):
    script = textwrap.dedent(f"""
        import time
        from pdorch.config import DiscoveryConfig
        from pdorch.worker.registration import WorkerRegistration
        cfg = DiscoveryConfig(mode="etcd", etcd_endpoints=("{etcd_server.endpoint}",), cluster="t", lease_ttl_s={TTL_S})
        WorkerRegistration(cfg, "decode", "d-9", "127.0.0.1:5002").start()
        print("registered", flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True)
    client = connect([etcd_server.endpoint])
    key = worker_key("t", "decode", "d-9")
    try:
        assert proc.stdout.readline().strip() == "registered"
        assert client.get(key)[0] is not None
        proc.kill()  # no revoke: only the lease expiry removes the key
        proc.wait(timeout=10)
        t0 = time.monotonic()
        wait_until(lambda: client.get(key)[0] is None, TTL_S + 3, "the dead worker's key to expire")
        assert time.monotonic() - t0 <= TTL_S + 2
    finally:
        stop_process(proc)
        client.close()


def test_router_watch_adds_and_drops_workers(etcd_server, standins, make_router):
    p, d = standins("prefill"), standins("decode")
    base = router_config([], [], policy="round_robin")
    cfg = dataclasses.replace(base, discovery=_disc(etcd_server))
    pre = WorkerRegistration(cfg.discovery, "prefill", "p-a", p.address).start()  # registered before the router
    r = make_router([], [], cfg=cfg)
    dec = None
    try:
        c = httpx.Client(base_url=r.url, timeout=20)
        assert c.get("/health").status_code == 503  # no decode worker yet
        dec = WorkerRegistration(cfg.discovery, "decode", "d-a", d.address).start()
        wait_until(lambda: c.get("/health").status_code == 200, 5, "the router to see the decode registration")
        ids = {(w["role"], w["worker_id"], w["address"]) for w in c.get("/workers").json()["workers"]}
        assert ids == {("prefill", "p-a", p.address), ("decode", "d-a", d.address)}
        out = c.post("/generate", json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}})
        assert out.status_code == 200 and d.behavior.calls[-1].prefill_address == p.address
        dec.stop()
        dec = None
        wait_until(lambda: [w for w in c.get("/workers").json()["workers"] if w["role"] == "decode"] == [], 5,
              "the router to drop the deregistered decode worker")
        assert c.post("/generate", json={"input_ids": [1]}).status_code == 503
    finally:
        pre.stop()
        if dec is not None:
            dec.stop()


def test_router_resyncs_after_etcd_restarts(etcd_server, standins, make_router, tmp_path):
    """The watch stream dies with etcd; the router keeps its workers, then follows new registrations."""
    from pdorch.local_stack.router import restart_etcd

    p, d = standins("prefill"), standins("decode")
    d2 = standins("decode")
    cfg = dataclasses.replace(router_config([], [], policy="round_robin"), discovery=_disc(etcd_server))
    regs = [WorkerRegistration(cfg.discovery, "prefill", "p", p.address).start(),
            WorkerRegistration(cfg.discovery, "decode", "d", d.address).start()]
    r = make_router([], [], cfg=cfg)
    c = httpx.Client(base_url=r.url, timeout=20)
    try:
        wait_until(lambda: c.get("/health").status_code == 200, 5, "the router to see both workers")
        restart_etcd(etcd_server)
        assert c.get("/health").status_code == 200  # known workers stay while etcd is away
        regs.append(WorkerRegistration(cfg.discovery, "decode", "d2", d2.address).start())
        wait_until(lambda: len([w for w in c.get("/workers").json()["workers"] if w["role"] == "decode"]) == 2, 10,
              "the router to see a registration made after etcd came back")
    finally:
        for reg in regs:
            reg.stop()


def test_real_workers_register_and_the_router_follows_their_lifetime(etcd_server, tmp_path, tiny_model_dir):
    """prefill_node/decode_node processes register in etcd; the router serves through them; a
    killed worker (no deregistration) disappears within the lease TTL."""
    import signal

    from engine.tokenizer import Tokenizer
    from pdorch.local_stack.router import RouterThread
    from pdorch.local_stack.workers import start_cluster

    disc = {"mode": "etcd", "etcd_endpoints": (etcd_server.endpoint,), "cluster": "e2e", "lease_ttl_s": TTL_S}
    cluster = start_cluster(tmp_path, tiny_model_dir, with_store=False, discovery=disc)
    r = None
    try:
        base = router_config([], [], policy="round_robin")
        r = RouterThread(dataclasses.replace(cluster.cfg, router=base.router), Tokenizer.from_dir(tiny_model_dir),
                         tiny_model_dir).start()
        c = httpx.Client(base_url=r.url, timeout=60)
        wait_until(lambda: c.get("/health").status_code == 200, 10, "the router to find both workers in etcd")
        addrs = {(w["role"], w["address"]) for w in c.get("/workers").json()["workers"]}
        assert addrs == {("prefill", cluster.prefill.address), ("decode", cluster.decode.address)}
        out = c.post("/generate", json={"input_ids": list(range(10, 40)), "sampling_params": {"max_new_tokens": 3}})
        assert out.status_code == 200 and out.json()["meta_info"]["completion_tokens"] == 3
        cluster.prefill.proc.send_signal(signal.SIGKILL)  # dies without revoking its lease
        t0 = time.monotonic()
        wait_until(lambda: all(w["role"] != "prefill" for w in c.get("/workers").json()["workers"]), TTL_S + 5,
              "the killed prefill worker to leave the router's view")
        assert time.monotonic() - t0 <= TTL_S + 3
        assert c.post("/generate", json={"input_ids": [1, 2]}).status_code == 503
    finally:
        if r is not None:
            r.stop()
        cluster.stop()
