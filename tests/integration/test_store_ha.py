"""Two mooncake_masters in HA mode behind a real etcd (leader election, metadata replicated by
Mooncake's oplog), the workers given the `etcd://` forms of both store addresses (the tiny model, a
real prefill and decode worker over the transfer engine).

1. The etcd:// forms end to end: a turn's prefix is read from the store after every L1 is flushed.
2. The leader SIGKILLed under streaming load: no request fails, the standby leads (time measured),
   and the next turns of conversations stored before the kill read their prefixes from the store.
3. Pages written lately that the new leader lacks are written again from the prefill worker's L1.
"""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys
import time
import urllib.request

import grpc
import pytest

from pdorch.local_stack.processes import stop_process
from pdorch.local_stack.router import Etcd, start_etcd
from pdorch.local_stack.workers import WorkerCluster, make_config, worker_metric
from pdorch.status import store_masters
from proto.pdorch.v1 import worker_pb2 as pb
from store_client.evictor import parse_metrics
from store_client.master import MasterProcess
from store_client.master_view import MasterView

PAGE = 16
LEAD_TIMEOUT_S = 30.0


class Masters:
    """The HA masters, stopped together (WorkerCluster.stop calls stop())."""

    def __init__(self, etcd: Etcd, log_dir: str, n: int = 2):
        self.etcd = etcd
        self.procs = [MasterProcess(ha_etcd=(etcd.endpoint,), log_dir=log_dir) for _ in range(n)]
        self.view = MasterView((etcd.endpoint,))

    def start(self) -> Masters:
        for m in self.procs:
            m.start()
        self.leader(LEAD_TIMEOUT_S)
        return self

    def leader(self, timeout_s: float) -> MasterProcess:
        """The master that leads (its /role and etcd's master view agree), waiting up to timeout_s."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            view = self.view.leader()
            for m in self.procs:
                if m.running() and view == m.master_address and m.role() == "leader":
                    return m
            time.sleep(0.1)
        raise AssertionError(f"no master leads after {timeout_s}s: view {self.view.leader()}, roles "
                             f"{[m.role() for m in self.procs]}")

    def stop(self) -> None:
        for m in self.procs:
            m.stop()


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    e = start_etcd(tmp_path_factory.mktemp("store_ha_etcd"))
    yield e
    stop_process(e.proc)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, tiny_model_dir, etcd):
    tmp = tmp_path_factory.mktemp("store_ha")
    masters = Masters(etcd, str(tmp)).start()
    address = "etcd://" + etcd.endpoint
    # NOTE: eviction by the master only: the chain evictor reads one master's metrics port, and two
    # masters on one host cannot share it (in a cluster each pod has its own address)
    cfg = make_config(tmp, tiny_model_dir, None, decode={"offload_generated_kv": True},
                      store={"enabled": True, "master_address": address, "metadata_server": address,
                             "eviction": "master", "reconnect_interval_s": 0.5})
    c = WorkerCluster(cfg, tmp, masters)
    with c.stopped_on_failure():
        c.wait_ready(c.spawn_worker("prefill"), c.spawn_worker("decode"))
        wait_store(c, True, 60)
    yield c
    c.stop(timeout_s=2.0)  # NOTE: a store client closing with etcd:// masters holds its process ~30 s


def store_on(c: WorkerCluster) -> bool:
    infos = []
    for wp in c.workers:
        with grpc.insecure_channel(wp.address) as ch:
            stub = ch.unary_unary("/pdorch.v1.PrefillService/Info" if wp.role == "prefill" else
                                  "/pdorch.v1.DecodeService/Info", request_serializer=pb.InfoRequest.SerializeToString,
                                  response_deserializer=pb.WorkerInfo.FromString)
            infos.append(stub(pb.InfoRequest(), timeout=10).store_enabled)
    return all(infos)


def wait_store(c: WorkerCluster, on: bool, timeout_s: float) -> float:
    t0 = time.monotonic()
    while store_on(c) != on:
        if time.monotonic() - t0 > timeout_s:
            raise AssertionError(f"the workers' store is not {'on' if on else 'off'} after {timeout_s}s")
        time.sleep(0.2)
    return time.monotonic() - t0


def worker_metrics(wp) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{wp.metrics_port}/metrics", timeout=10).read().decode()
    return parse_metrics(text)


def prompt(k: int, n: int = 100) -> list[int]:
    return [(k * 7919 + i * 31) % 900 + 20 for i in range(n)]


def stored_prefix(c: WorkerCluster, k: int) -> tuple[list[int], int]:
    """Turn 1 of conversation k to its end (offloaded), then turn 2's ids and the tokens of its
    page-aligned prefix the store must hold."""
    turn1 = prompt(k)
    out = c.generate(turn1, max_tokens=24, temperature=0, ignore_eos=True).token_ids
    turn2 = turn1 + out + prompt(k + 1000, 20)
    fed = len(turn1) + len(out) - 1  # the last generated token is never fed, so never stored
    return turn2, fed // PAGE * PAGE


def test_the_etcd_forms_work_end_to_end(cluster):
    turn2, in_store = stored_prefix(cluster, 1)
    cluster.flush_l1()
    got = cluster.generate(turn2, max_tokens=4, temperature=0)
    assert got.cached.device == 0 and got.cached.store >= in_store, got.cached


def test_a_leader_killed_under_streaming_load_loses_no_request_and_no_stored_prefix(cluster):
    masters = cluster.master
    before = [stored_prefix(cluster, k) for k in range(10, 14)]  # conversations stored before the kill
    leader = masters.leader(LEAD_TIMEOUT_S)
    assert store_masters(cluster.cfg.store) == sorted(  # pdorch status: the standby too, with pids
        ({"address": m.master_address, "leader": m is leader, "pid": m.pid} for m in masters.procs),
        key=lambda m: m["address"])
    stop = time.monotonic() + 25

    def stream(k: int) -> int:
        done = 0
        while time.monotonic() < stop:
            got = cluster.generate(prompt(100 + k * 50 + done, 60), max_tokens=32, temperature=0, ignore_eos=True)
            assert got.finish_reason == "length" and len(got.token_ids) == 32
            done += 1
        return done

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(stream, k) for k in range(3)]
        time.sleep(3)
        t_kill = time.monotonic()
        leader.kill()
        new = masters.leader(LEAD_TIMEOUT_S)
        lead_s = time.monotonic() - t_kill
        served = [f.result(timeout=120) for f in futures]  # raises if any request failed
    assert new is not leader and all(n >= 1 for n in served), served
    back_s = wait_store(cluster, True, 60)
    print(f"standby led {lead_s:.2f}s after the kill; workers' store back {back_s:.2f}s later; "
          f"{sum(served)} requests served across the switch")
    assert lead_s < LEAD_TIMEOUT_S
    shown = store_masters(cluster.cfg.store)  # pdorch status: the new leader; the killed one is gone
    assert shown == [{"address": new.master_address, "leader": True, "pid": new.pid}], shown
    for wp in cluster.workers:  # each worker saw the lead move (its connector reads etcd every second)
        deadline = time.monotonic() + 10
        while (values := worker_metrics(wp))["pdorch_store_master_leader_changes_total"] < 1:
            assert time.monotonic() < deadline, (wp.role, values)
            time.sleep(0.2)
        assert values["pdorch_store_master_leading"] == 1
    cluster.flush_l1()
    read = [cluster.generate(turn2, max_tokens=4, temperature=0).cached for turn2, _ in before]
    want = sum(n for _, n in before)
    got = sum(c.store for c in read)
    assert got >= 0.9 * want, (got, want, read)


# Removes every object as a pure store client and exits without Mooncake's close (with etcd:// it
# holds the process ~30 s).
_REMOVE_ALL = """
import os, sys
from mooncake.store import MooncakeDistributedStore
s = MooncakeDistributedStore()
assert s.setup("127.0.0.1", sys.argv[1], 0, 16 << 20, "tcp", "", sys.argv[1]) == 0
print(s.remove_all(True), flush=True)
os._exit(0)
"""


def wait_metric(wp, name: str, at_least: float, timeout_s: float, **labels) -> float:
    deadline = time.monotonic() + timeout_s
    while (value := worker_metric(wp, name, **labels)) < at_least:
        assert time.monotonic() < deadline, (wp.role, name, labels, value)
        time.sleep(0.2)
    return value


def test_pages_a_leader_switch_lost_are_written_again_from_l1(cluster):
    """Pages written lately that the new leader lacks (here: removed just before the kill, as a write
    the oplog had not replicated would be) are found by the worker's audit after the switch and
    written again from its L1: the next turn reads them from the store."""
    masters = cluster.master
    for m in masters.procs:
        if not m.running():
            m.restart()  # back as a standby
    leader = masters.leader(LEAD_TIMEOUT_S)
    prefill = next(wp for wp in cluster.workers if wp.role == "prefill")
    lost_before = worker_metric(prefill, "pdorch_store_lost_on_leader_change_pages_total")
    turn1 = prompt(40)
    out = cluster.generate(turn1, max_tokens=8, temperature=0, ignore_eos=True).token_ids
    prompt_pages = len(turn1) // PAGE
    # P's write-through of turn 1's pages has completed: none of them is still PENDING (a page in flight
    # is not written again from L1) nor lands after the removal below. NOTE: a fixed 2 s was not always
    # enough on a loaded machine once a page became one store object per KV-head group.
    cluster.wait_idle("prefill", timeout_s=60, wp=prefill)
    cluster.wait_idle("decode", timeout_s=60)
    removed = subprocess.run([sys.executable, "-c", _REMOVE_ALL, "etcd://" + masters.etcd.endpoint],
                             capture_output=True, text=True, timeout=60, check=True)
    assert int(removed.stdout.strip().splitlines()[-1]) >= prompt_pages, removed
    time.sleep(3)  # the removal reaches the standby (as a write 3 s old always did)
    leader.kill()
    masters.leader(LEAD_TIMEOUT_S)
    lost = wait_metric(prefill, "pdorch_store_lost_on_leader_change_pages_total", lost_before + prompt_pages, 60)
    # NOTE: at least one, not all: the decode worker audits its own writes too and writes again the
    # pages its L1 holds; a turn-1 page it also wrote may be back before P's second look, so P finds it
    # present (seen under load, before and after layout v2). The next turn's read below is the proof
    # that every page is back.
    restored = wait_metric(prefill, "pdorch_prefill_store_policy_written_pages_total", 1, 30,
                           reason="restore")
    print(f"audit after the switch: {lost - lost_before:.0f} pages lost, {restored:.0f} written again from L1")
    cluster.flush_l1()
    got = cluster.generate(turn1 + out, max_tokens=4, temperature=0).cached
    assert got.store >= prompt_pages * PAGE, got
