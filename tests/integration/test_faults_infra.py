"""The cluster's infrastructure fails under load (issue 14, fault tests): mooncake_master killed,
etcd stopped. Real worker processes behind the real router; every wait bounded."""

from __future__ import annotations

import dataclasses
import logging
import time

import httpx

from engine.tokenizer import Tokenizer
from pdorch.local_stack.router import RouterThread, _start_etcd, router_config, wait_until
from pdorch.local_stack.workers import start_cluster
from tests.fixtures.traffic import Traffic
from tests.integration.fault_helpers import assert_survivors_sound, prompt, start_router


def _load(url: str, seeds: range) -> Traffic:
    """Two clients, each request a 40-token prompt of one of `seeds`."""
    return Traffic(url, lambda client, n: {"input_ids": prompt(40, seed=seeds[(client + 2 * n) % len(seeds)]),
                                           "sampling_params": {"max_new_tokens": 4, "temperature": 0}})


def _metric(url: str, name: str, **labels) -> float:
    total = 0.0
    for line in httpx.get(url, timeout=5).text.splitlines():
        if line.startswith((name + "{", name + " ")) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _store_tokens(url: str, seed: int) -> int:
    r = httpx.post(url + "/generate", timeout=60, json={"input_ids": prompt(40, seed=seed),
                                                        "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
    assert r.status_code == 200, r.text
    return r.json()["meta_info"]["cached_tokens_details"]["store"]


def test_killed_master_costs_recompute_not_errors_and_hits_return_after_restart(tmp_path, tiny_model_dir):
    cluster = start_cluster(tmp_path, tiny_model_dir, with_store=True, store={"reconnect_interval_s": 0.5,
                                                                              "op_timeout_s": 2.0})
    router = start_router(cluster, tiny_model_dir)
    p_metrics = f"http://127.0.0.1:{cluster.prefill.metrics_port}/metrics"
    pids = [w.proc.pid for w in cluster.workers]
    try:
        def store_hit(seed: int) -> int:  # the page written by one request, read back from the store
            _store_tokens(router.url, seed)
            cluster.flush_l1()  # every L1, D's own too: the prefix can only come from the store now
            return _store_tokens(router.url, seed)

        assert store_hit(100) >= 32
        misses_before = _metric(p_metrics, "pdorch_store_miss_pages_total")
        with _load(router.url, range(200, 206)) as load:
            time.sleep(1.0)
            cluster.master.kill()
            t_kill = time.monotonic()
            time.sleep(6.0)
        assert load.results and set(load.statuses()) == {200}, f"requests failed: {load.results}"
        assert _metric(p_metrics, "pdorch_store_enabled") == 0
        misses = _metric(p_metrics, "pdorch_store_miss_pages_total") - misses_before
        by_reason = {line for line in httpx.get(p_metrics).text.splitlines()
                     if line.startswith("pdorch_store_miss_pages_total{") and not line.endswith(" 0.0")}
        assert misses > 0 and by_reason, "the lost store's misses are counted, by reason"

        cluster.master.start()  # same ports; the workers re-mount their segments by themselves
        wait_until(lambda: _metric(p_metrics, "pdorch_store_enabled") == 1, 30, "the prefill worker to reconnect")
        wait_until(lambda: store_hit(300) >= 32, 30, "store hits to return")
        assert [w.proc.pid for w in cluster.workers if w.proc.poll() is None] == pids, "no worker restarted"
        print(f"master down {time.monotonic() - t_kill:.1f}s; {len(load.results)} requests served meanwhile; "
              f"misses by reason: {sorted(by_reason)}")
        assert_survivors_sound(cluster)
    finally:
        router.stop()
        cluster.stop()


def test_stopped_etcd_keeps_routing_to_known_workers_and_registrations_return(tmp_path, tiny_model_dir, caplog):
    from pdorch.local_stack.processes import free_port, stop_process
    from pdorch.local_stack.router import Etcd

    client_port, peer_port = free_port(), free_port()
    etcd = Etcd(f"127.0.0.1:{client_port}", client_port, peer_port, str(tmp_path / "etcd"), str(tmp_path / "etcd.log"))
    _start_etcd(etcd)
    disc = {"mode": "etcd", "etcd_endpoints": (etcd.endpoint,), "cluster": "faults", "lease_ttl_s": 3}
    cluster = start_cluster(tmp_path, tiny_model_dir, with_store=False, discovery=disc)
    router = None
    try:
        base = router_config([], [], policy="round_robin")
        router = RouterThread(dataclasses.replace(cluster.cfg, router=base.router),
                              Tokenizer.from_dir(tiny_model_dir), tiny_model_dir).start()
        wait_until(lambda: httpx.get(router.url + "/health", timeout=5).status_code == 200, 20, "workers via etcd")
        caplog.set_level(logging.WARNING, logger="pdorch.router")
        with _load(router.url, range(400, 404)) as load:
            time.sleep(1.0)
            stop_process(etcd.proc)
            time.sleep(8.0)  # longer than the lease TTL: registrations are gone from the router's view of etcd
        assert load.results and set(load.statuses()) == {200}, f"requests failed: {load.results}"
        said = " ".join(r.getMessage() for r in caplog.records)
        assert "last known workers" in said, said

        _start_etcd(etcd)
        wait_until(lambda: _registered(etcd.endpoint, "faults") == 2, 30, "both workers to register again")
        workers = httpx.get(router.url + "/workers", timeout=10).json()["workers"]
        assert {w["role"] for w in workers} == {"prefill", "decode"}
        r = httpx.post(router.url + "/generate", timeout=60, json={"input_ids": prompt(30, seed=9),
                                                                   "sampling_params": {"max_new_tokens": 3}})
        assert r.status_code == 200, r.text
        assert_survivors_sound(cluster)
    finally:
        if router is not None:
            router.stop()
        cluster.stop()
        if etcd.proc is not None:
            stop_process(etcd.proc)


def _registered(endpoint: str, cluster: str) -> int:
    from pdorch.worker.registration import connect, workers_prefix
    try:
        client = connect([endpoint], timeout_s=2)
    except ConnectionError:
        return -1  # etcd still starting
    try:
        return len(list(client.get_prefix(workers_prefix(cluster))))
    finally:
        client.close()
