"""A leader switch is a new term, not a new address, and the audit after it covers what it claims
(real mooncake_masters in HA mode, a real etcd, a real prefill and decode worker, the tiny model).

1. The only master SIGKILLed and restarted at its own address wins again, holding what its oplog
   replayed: the workers count a leader change and audit their recent writes. Pages removed just
   before the kill (a stand-in for writes the oplog had not replicated: a restart kept every
   replicated page, and lost a few of the last ones in some runs only) are written again from the
   L1s (prompt pages by the prefill worker, generated pages by the decode worker), and the next
   turn reads its whole prefix from the store.
2. With a standby: pages removed from the store just before the leader's kill (as writes the oplog
   had not replicated) include the decode worker's generated pages; the decode worker writes them
   again and the next turn reads them from the store.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from pdorch.local_stack.processes import stop_process
from pdorch.local_stack.router import start_etcd
from pdorch.local_stack.workers import WorkerCluster, make_config, worker_metric
from store_client.master import MasterProcess
from store_client.master_view import MasterView
from tests.integration.test_store_ha import (
    _REMOVE_ALL,
    LEAD_TIMEOUT_S,
    Masters,
    prompt,
    stored_prefix,
    wait_metric,
    wait_store,
)

RESTORED = "pdorch_decode_restored_pages_total"
CHANGES = "pdorch_store_master_leader_changes_total"
LOST = "pdorch_store_lost_on_leader_change_pages_total"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, tiny_model_dir):
    tmp = tmp_path_factory.mktemp("master_restart")
    etcd = start_etcd(tmp)
    masters = Masters(etcd, str(tmp), n=1)
    try:
        masters.start()
    except BaseException:
        masters.stop()
        stop_process(etcd.proc)
        raise
    address = "etcd://" + etcd.endpoint
    cfg = make_config(tmp, tiny_model_dir, None, decode={"offload_generated_kv": True, "prefix_cache": True},
                      store={"enabled": True, "master_address": address, "metadata_server": address,
                             "eviction": "master", "reconnect_interval_s": 0.5, "audit_window_s": 10.0})
    c = WorkerCluster(cfg, tmp, masters)
    try:
        with c.stopped_on_failure():
            c.wait_ready(c.spawn_worker("prefill"), c.spawn_worker("decode"))
            wait_store(c, True, 60)
        yield c
    finally:
        c.stop(timeout_s=2.0)  # NOTE: a store client closing with etcd:// masters holds its process ~30 s
        stop_process(etcd.proc)


def remove_all(masters: Masters) -> int:
    """Remove every object from the store (a pure store client in a child process), then wait until
    the oplog has it (as a write 3 s old always was); the objects removed."""
    removed = subprocess.run([sys.executable, "-c", _REMOVE_ALL, "etcd://" + masters.etcd.endpoint],
                             capture_output=True, text=True, timeout=60, check=True)
    time.sleep(3)
    return int(removed.stdout.strip().splitlines()[-1])


def roles(c: WorkerCluster):
    return next(wp for wp in c.workers if wp.role == "prefill"), next(wp for wp in c.workers if wp.role == "decode")


def test_a_leader_restarted_at_its_address_is_a_switch_and_its_lost_pages_come_back(cluster):
    masters = cluster.master
    only = masters.leader(LEAD_TIMEOUT_S)
    view = MasterView((masters.etcd.endpoint,))
    before = view.term()
    prefill, decode = roles(cluster)
    changes = [worker_metric(wp, CHANGES) for wp in (prefill, decode)]
    restored = worker_metric(decode, RESTORED)
    lost = [worker_metric(wp, LOST) for wp in (prefill, decode)]
    turn2, in_store = stored_prefix(cluster, 7)
    cluster.wait_idle("prefill", timeout_s=60, wp=prefill)
    cluster.wait_idle("decode", timeout_s=60)
    remove_all(masters)
    only.kill()
    only.start()  # the same ports: once the old lease runs out it wins again
    assert masters.leader(LEAD_TIMEOUT_S) is only
    after = view.term()
    assert after.address == before.address and after != before, (before, after)
    for wp, was in zip((prefill, decode), changes):  # each worker saw a switch, though the address is the same
        wait_metric(wp, CHANGES, was + 1, 30)
    # the audit found the pages gone; each worker wrote again what its L1 holds (decode: the generated ones)
    wait_metric(prefill, LOST, lost[0] + 1, 60)
    wait_metric(decode, LOST, lost[1] + 1, 60)
    wait_metric(decode, RESTORED, restored + 1, 60)
    wait_metric(prefill, "pdorch_prefill_store_policy_written_pages_total", 1, 60, reason="restore")
    cluster.flush_l1()
    got = cluster.generate(turn2, max_tokens=4, temperature=0).cached
    assert got.device == 0 and got.store >= in_store, (got, in_store)


def test_generated_pages_removed_before_a_kill_are_written_again_by_decode(cluster):
    masters = cluster.master
    for m in masters.procs:
        if not m.running():
            m.start()
    standby = MasterProcess(ha_etcd=(masters.etcd.endpoint,), log_dir=masters.procs[0].log_dir).start()
    masters.procs.append(standby)  # stopped with the others
    leader = masters.leader(LEAD_TIMEOUT_S)
    assert standby.role() == "standby"
    prefill, decode = roles(cluster)
    restored = worker_metric(decode, RESTORED)
    rewritten = worker_metric(prefill, "pdorch_prefill_store_policy_written_pages_total", reason="restore")
    turn1 = prompt(60)
    out = cluster.generate(turn1, max_tokens=40, temperature=0, ignore_eos=True).token_ids
    fed = len(turn1) + len(out) - 1  # the last generated token is never fed, so never stored
    generated_pages = fed // 16 - len(turn1) // 16
    assert generated_pages >= 2
    cluster.wait_idle("prefill", timeout_s=60, wp=prefill)
    cluster.wait_idle("decode", timeout_s=60)
    assert remove_all(masters) >= generated_pages
    leader.kill()
    assert masters.leader(LEAD_TIMEOUT_S) is standby
    # only the decode worker wrote the generated pages: they are back only if it wrote them again
    wait_metric(decode, RESTORED, restored + generated_pages, 60)
    # and the prompt's pages, removed too, only if the prefill worker wrote them again (each worker's store
    # comes back on its own: after remove_all its canary is gone too, CANARY_GRACE_S later)
    wait_metric(prefill, "pdorch_prefill_store_policy_written_pages_total", rewritten + len(turn1) // 16, 60,
                reason="restore")
    cluster.flush_l1()
    got = cluster.generate(turn1 + out, max_tokens=4, temperature=0).cached
    assert got.device == 0 and got.store >= fed // 16 * 16, (got, fed)
