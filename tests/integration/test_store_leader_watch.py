"""HA masters, the store connector's side: a new leader heard from an etcd watch, and a close that
does not stop the process's other threads.

1. Against a real etcd (no master needed: the view key is written as a master writes it, under a
   lease): a new term is seen within a fraction of a second although the connector's own retry is
   30 s and the watch is its only trigger; after etcd restarts, the watch is started again and the
   next term is seen too.
2. A KVStore connected to real HA masters closes while a ticker thread runs: the ticker never stops
   for long (Mooncake's close of such a client holds the GIL up to 30 s: it is parked to exit).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from prometheus_client import CollectorRegistry

from pdorch.local_stack.router import restart_etcd, wait_until
from pdorch.worker.registration import connect
from store_client.config import StoreConfig
from store_client.connector import StoreConnector
from store_client.master import MasterProcess
from store_client.master_view import view_key
from store_client.metrics import StoreMetrics
from store_client.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
SEEN_WITHIN_S = 0.5


def win(client, address: str) -> None:
    """What a master does when it wins: the view key under a fresh lease (a new term)."""
    client.delete(view_key())
    client.put(view_key(), address, lease=client.lease(30))


def answering(endpoint: str, timeout_s: float = 10.0):
    """A client of etcd once it answers (a restarted etcd listens before it serves)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return connect([endpoint])
        except ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_a_new_leader_is_heard_from_the_watch_and_after_etcd_restarts(etcd_server):
    reg = CollectorRegistry()
    address = "etcd://" + etcd_server.endpoint
    # No metadata server answers: the connector never sets a client up, it only follows the view.
    cfg = StoreConfig(master_address=address, metadata_server=f"http://127.0.0.1:{free_port()}/metadata",
                      reconnect_interval_s=30.0)
    connector = StoreConnector(cfg, StoreMetrics(reg))
    client = connect([etcd_server.endpoint])
    try:
        win(client, "10.0.0.1:50051")
        connector.start()
        wait_until(lambda: connector.leader == "10.0.0.1:50051", 5.0, "the first term")
        wait_until(lambda: connector._watch.active, 5.0, "the watch")

        t0 = time.monotonic()
        win(client, "10.0.0.1:50051")  # the same address, a new term
        wait_until(lambda: reg.get_sample_value("pdorch_store_master_leader_changes_total") == 1, 5.0,
                   "the new term")
        assert time.monotonic() - t0 < SEEN_WITHIN_S

        restart_etcd(etcd_server)  # the watch's stream ends; the connector watches again
        client = answering(etcd_server.endpoint)
        wait_until(lambda: connector._watch.active, 10.0, "the watch after the restart")
        t0 = time.monotonic()
        win(client, "10.0.0.2:50051")
        wait_until(lambda: connector.leader == "10.0.0.2:50051", 5.0, "the term after the restart")
        assert time.monotonic() - t0 < SEEN_WITHIN_S
        assert reg.get_sample_value("pdorch_store_master_leader_changes_total") == 2
    finally:
        connector.stop()
        client.close()
    assert not connector._thread.is_alive()


CLOSE_WHILE_TICKING = textwrap.dedent("""
    import json, os, sys, threading, time
    from prometheus_client import CollectorRegistry
    from store_client.config import StoreConfig
    from store_client.deferred_close import parked
    from store_client.metrics import StoreMetrics
    from store_client.store import KVStore

    address = sys.argv[1]
    cfg = StoreConfig(master_address=address, metadata_server=address, global_segment_size_mb=16,
                      local_buffer_size_mb=16)
    store = KVStore(cfg, 4096, StoreMetrics(CollectorRegistry()))
    assert store.wait_enabled(60), "the store did not connect"
    gaps, stop = [], threading.Event()

    def tick():
        last = time.monotonic()
        while not stop.is_set():
            time.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticker = threading.Thread(target=tick)
    ticker.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    store.close()
    close_s = time.monotonic() - t0
    time.sleep(0.3)
    stop.set()
    ticker.join(5)
    print(json.dumps({"max_gap_s": max(gaps), "close_s": close_s, "parked": parked()}), flush=True)
    os._exit(0)  # NOTE: the test ends here; a worker closes the parked client at exit (up to 30 s)
""")


def test_closing_a_client_of_ha_masters_does_not_stop_other_threads(etcd_server, tmp_path):
    masters = [MasterProcess(ha_etcd=(etcd_server.endpoint,), log_dir=str(tmp_path)).start() for _ in range(2)]
    try:
        proc = subprocess.run([sys.executable, "-c", CLOSE_WHILE_TICKING, "etcd://" + etcd_server.endpoint],
                              check=False, capture_output=True, text=True, timeout=120, cwd=ROOT)
    finally:
        for m in masters:
            m.stop()
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["parked"] == 1
    assert got["close_s"] < 1.0 and got["max_gap_s"] < 1.0, got  # Mooncake's own close: 18-30 s frozen
