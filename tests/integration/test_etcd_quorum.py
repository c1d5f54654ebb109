"""Two mooncake_masters in HA mode over a real 3-member etcd (the chart's default with HA masters,
started with the chart's compaction and quota flags), Mooncake's snapshots turned on.

1. The oplog in etcd over 10,000 object writes: what the installed Mooncake does with it.
2. One etcd member (the raft leader) SIGKILLed, then the leading master: the standby leads over the
   two members left, and a store client given all three endpoints puts and gets.
"""

from __future__ import annotations

import time

import etcd3
import pytest

from store_client.master import MasterProcess
from store_client.master_view import MasterView
from tests.fixtures.etcd_cluster import EtcdCluster, write_objects

LEAD_TIMEOUT_S = 30.0
OPLOG_BATCHES = "/oplog/mooncake_cluster/batches/"  # Mooncake's batch records: /oplog/<cluster id>/batches/<id>
# Snapshots as Mooncake documents them, every second so that a test of seconds would see one.
SNAPSHOT_FLAGS = ("--enable_snapshot=true", "--snapshot_interval_seconds=1", "--snapshot_object_store_type=local")


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    cluster = EtcdCluster(tmp_path_factory.mktemp("etcd_quorum")).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def masters(etcd, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("etcd_quorum_masters")
    procs = [MasterProcess(ha_etcd=etcd.endpoints, log_dir=str(tmp), extra_args=SNAPSHOT_FLAGS) for _ in range(2)]
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("MOONCAKE_SNAPSHOT_LOCAL_PATH", str(tmp / "snapshots"))  # the local object store's dir
            for m in procs:
                m.start()
        leader(procs, etcd.endpoints, LEAD_TIMEOUT_S)
        yield procs
    finally:
        for m in procs:
            m.stop()


def leader(procs: list[MasterProcess], endpoints: tuple[str, ...], timeout_s: float) -> MasterProcess:
    """The master that leads (its /role and etcd's master view agree), waiting up to timeout_s."""
    view = MasterView(endpoints)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        address = view.leader()
        for m in procs:
            if m.running() and address == m.master_address and m.role() == "leader":
                return m
        time.sleep(0.1)
    raise AssertionError(f"no master leads after {timeout_s}s: view {view.leader()}, roles {[m.role() for m in procs]}")


def oplog(endpoints: tuple[str, ...]) -> tuple[list[int], int]:
    """(the oplog's batch ids, the bytes of keys and values) under OPLOG_BATCHES, from a member that answers."""
    for endpoint in endpoints:
        host, port = endpoint.rsplit(":", 1)
        try:
            client = etcd3.client(host=host, port=int(port), timeout=2)
            rows = list(client.get_prefix(OPLOG_BATCHES))
            client.close()
        except Exception:  # noqa: BLE001, S112 - etcd3 raises its own and grpc's errors: ask the next member
            continue
        ids = sorted(int(meta.key.decode().rsplit("/", 1)[1]) for _, meta in rows)
        return ids, sum(len(value) + len(meta.key) for value, meta in rows)
    raise AssertionError(f"no etcd member of {endpoints} answers")


def test_the_installed_master_keeps_every_oplog_batch_even_with_snapshots_on(etcd, masters):
    """Mooncake 0.3.13.post1 (the newest on the registry) does not bound the oplog: its leader logs
    "Skipping primary snapshot generation in batch-record OpLog mode; snapshots are owned by standby"
    and its standby writes no snapshot and deletes no batch, so every write stays in etcd (~200
    bytes an object). When this fails, Mooncake prunes the oplog: turn the snapshots on in
    `pdorch master` (pdorch/master_cmd.py) and make this the bound check (docs/operations.md, "etcd")."""
    ids_before, bytes_before = oplog(etcd.endpoints)
    written = write_objects(etcd.endpoints, 10_000, "oplog")
    assert written["setup"] == 0 and written["first_ok"], written
    time.sleep(3.0)  # three snapshot intervals
    ids, size = oplog(etcd.endpoints)
    grown = size - bytes_before
    print(f"oplog: {len(ids_before)} -> {len(ids)} batches, {bytes_before} -> {size} bytes ({grown / 10_000:.0f} B a write)")
    assert ids[0] == 1 and ids == list(range(1, ids[-1] + 1))  # nothing pruned: the log from its first batch
    assert grown > 10_000 * 50  # measured ~200 B a write (a put's record; the writer's expiry adds removes)
    lead = leader(masters, etcd.endpoints, LEAD_TIMEOUT_S)
    with open(lead.log_path, errors="replace") as log:
        assert "Skipping primary snapshot generation" in log.read()


def test_with_an_etcd_member_killed_the_standby_leads_and_the_store_serves(etcd, masters):
    victim = etcd.members[0]  # the first endpoint every client tries
    victim.kill()
    etcd.raft_leader(15.0)  # the two members left elect a raft leader: a quorum of 2 of 3
    old = leader(masters, etcd.endpoints, LEAD_TIMEOUT_S)
    old.kill()
    killed_at = time.monotonic()
    new = leader(masters, etcd.endpoints, LEAD_TIMEOUT_S)
    print(f"standby led {time.monotonic() - killed_at:.1f}s after the SIGKILL, etcd member {victim.name} down")
    assert new is not old and new.running()
    # NOTE: a new leader serves after its warm-up (docs/workers.md, "Master HA"): retry to a deadline
    deadline, written = time.monotonic() + LEAD_TIMEOUT_S, {}
    while time.monotonic() < deadline:
        written = write_objects(etcd.endpoints, 10, f"after-{int(time.monotonic() * 1000)}")
        if written["setup"] == 0 and written["failed_batches"] == 0 and written["first_ok"]:
            break
        time.sleep(0.5)
    assert written == {"setup": 0, "failed_batches": 0, "first_ok": True}, written
