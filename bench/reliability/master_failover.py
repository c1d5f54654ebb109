"""Masters in HA mode: from the leader's SIGKILL to the first store hit on the new leader, through
pdorch's own store client, in one run.

    python -m bench.reliability.master_failover [--runs 3] [--pages 256] [--page-kb 64] [--json]

Starts a real etcd and two mooncake_masters in HA mode (store_client/master.py, oplog on), and a
KVStore (store_client/store.py) addressing them as etcd://..., its transfer-engine metadata in etcd
and its own segment holding the pages, with the store config's defaults (reconnect_interval_s
included) as a worker has them. It writes --pages pages, then per run: SIGKILL the leader; poll
etcd's master view (the leader's term: store_client/master_view.py), the new leader's phase and a
load of every page every 50 ms until all are read back; restart the killed master (it comes back as
a standby, the next run kills the other one).

Reported per run and as medians: seconds to a new term in etcd (the standby won), to the new leader
serving (Mooncake's master waits one lease, 5 s, after it wins before it answers RPCs), and to the
first load that read every page (the store's first hit on the new leader), the first hit after the
new leader served, the fraction of the pages written before
the kill readable after it, and the loads that missed meanwhile (the workers serve those as misses:
recomputed, never failed). Mooncake's oplog keeps the index but for the last moments before a
kill; pdorch's store client audits its recent writes after the switch (store_client/recent_writes.py)
and hands the keys the new leader lacks to the worker, which writes again those it holds. Here the
bench holds every page, so it writes every lost one again: the pages lost, the seconds from the kill
to the audit's answer, and the pages written again per second. Then the control: one fresh client's
`setup` against the HA address and against the leader's own address, timed alone.
"""

from __future__ import annotations

import argparse
import json
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # NOTE: before the imports

import numpy as np
from prometheus_client import CollectorRegistry

from bench.multiturn.facts import commit
from store_client.addresses import metadata_for_mooncake, parse_master_address
from store_client.config import StoreConfig
from store_client.deferred_close import close_client
from store_client.master import MasterProcess
from store_client.master_view import Leader, MasterView
from store_client.metrics import StoreMetrics
from store_client.ports import free_port
from store_client.store import KVStore

POLL_S = 0.05
WAIT_S = 60.0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.reliability.master_failover", description=__doc__.split("\n")[0],
                                allow_abbrev=False)
    p.add_argument("--runs", type=int, default=3, help="leader kills (default 3)")
    p.add_argument("--pages", type=int, default=256, help="pages written before the kills (default 256)")
    p.add_argument("--page-kb", type=int, default=64, help="page size in KiB (default 64)")
    p.add_argument("--settle", default="0,3", help="seconds between the write and the kill, one set of runs each "
                   "(default 0,3: Mooncake replicates its oplog in batches)")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    return p


def start_etcd(tmp: str) -> tuple[subprocess.Popen, str]:
    binary = shutil.which("etcd")
    if binary is None:
        raise SystemExit("the `etcd` binary is not installed (make setup installs Debian's etcd-server)")
    client, peer = free_port(), free_port()
    with open(f"{tmp}/etcd.log", "wb") as log:
        proc = subprocess.Popen(
            [binary, "--name", "bench", "--data-dir", f"{tmp}/etcd", "--listen-client-urls",
             f"http://127.0.0.1:{client}", "--advertise-client-urls", f"http://127.0.0.1:{client}",
             "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls",
             f"http://127.0.0.1:{peer}", "--initial-cluster", f"bench=http://127.0.0.1:{peer}"],
            stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    import etcd3

    deadline = time.monotonic() + 20
    while True:  # until etcd answers a read
        try:
            etcd3.client(port=client, timeout=0.5).get("probe")
            return proc, f"127.0.0.1:{client}"
        except Exception:  # noqa: BLE001 - not up yet
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise SystemExit(f"etcd did not start (see {tmp}/etcd.log)") from None
            time.sleep(0.1)


def leader_of(masters: list[MasterProcess], view: MasterView, timeout_s: float = WAIT_S) -> tuple[MasterProcess, Leader]:
    """The serving leader and its term, waiting up to timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        term = view.term()
        for m in masters:
            if term is not None and m.running() and term.address == m.master_address and m.ha_state() == "serving":
                return m, term
        time.sleep(POLL_S)
    raise RuntimeError(f"no master serves after {timeout_s:.0f} s")


def one_kill(masters, view, store, keys, addrs, settle_s: float) -> dict:
    lost_q: queue.Queue = queue.Queue()
    store.on_lost = lambda lost: lost_q.put((time.monotonic(), lost))  # the connector thread's audit
    addr_of = dict(zip(keys, addrs))
    saved = store.save(keys, addrs)
    if saved.pages_written != len(keys):
        raise RuntimeError(f"writing the pages failed: {saved}")
    time.sleep(settle_s)
    old, old_term = leader_of(masters, view)
    t0 = time.monotonic()
    old.kill()
    lead_s = serving_s = hit_s = audit_s = None
    misses = lost_n = restored = 0
    restore_s = 0.0
    while time.monotonic() - t0 < WAIT_S / 4:
        now = time.monotonic() - t0
        term = view.term()
        if lead_s is None and term not in (None, old_term):
            lead_s = now
        if lead_s is not None and serving_s is None:
            new = next((m for m in masters if m.running() and m.master_address == term.address), None)
            if new is not None and new.ha_state() == "serving":
                serving_s = time.monotonic() - t0
        while not lost_q.empty():  # the audit found pages the new leader lacks: write them again
            at, lost = lost_q.get()
            audit_s, lost_n = at - t0, lost_n + len(lost)
            mine = [k for k in lost if k in addr_of]
            t1 = time.perf_counter()
            restored += store.save(mine, [addr_of[k] for k in mine]).pages_written
            restore_s += time.perf_counter() - t1
        got = store.load(keys, addrs)
        if got.pages_loaded == len(keys):
            hit_s = time.monotonic() - t0
            break
        misses += 1
        time.sleep(POLL_S)
    readable = store.load(keys, addrs).pages_loaded / len(keys)
    old.start()  # back as a standby
    after = round(hit_s - serving_s, 3) if hit_s is not None and serving_s is not None else None
    return {"lead_s": lead_s, "serving_s": serving_s, "first_hit_s": hit_s, "hit_after_serving_s": after,
            "readable_after": readable, "missed_loads": misses,
            "lost_pages": lost_n, "audit_s": audit_s, "restored_pages": restored,
            "restored_pages_per_s": round(restored / restore_s) if restored and restore_s > 0 else None}


def setup_control(cfg: StoreConfig, leader: MasterProcess) -> dict:
    """What Mooncake's own client setup costs, timed alone against a serving leader: through the HA
    address (etcd, as the workers connect) and straight to the leader's RPC address."""
    from mooncake.store import MooncakeDistributedStore

    out = {}
    for name, master in (("setup_ha_s", cfg.master_address), ("setup_direct_s", leader.master_address)):
        raw = MooncakeDistributedStore()
        t0 = time.perf_counter()
        rc = raw.setup(cfg.local_hostname, metadata_for_mooncake(cfg.metadata_server), 0, 16 << 20, cfg.protocol,
                       cfg.device_name, parse_master_address(master).mooncake)
        out[name] = round(time.perf_counter() - t0, 3) if rc == 0 else f"failed ({rc})"
        close_client(raw, parse_master_address(master).ha)  # HA: at exit (its close holds the GIL up to 30 s)
    return out


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    say = (lambda m: print(m, file=sys.stderr, flush=True)) if args.json else (lambda m: print(m, flush=True))
    tmp = tempfile.mkdtemp(prefix="pdorch-master-failover-")
    page = args.page_kb << 10
    etcd, endpoint = start_etcd(tmp)
    masters = [MasterProcess(ha_etcd=(endpoint,), log_dir=tmp) for _ in range(2)]
    store = None
    runs = []
    control = {}
    try:
        for m in masters:
            m.start()
        view = MasterView((endpoint,))
        leader_of(masters, view)
        address = "etcd://" + endpoint
        settles = [float(x) for x in args.settle.split(",") if x]
        # NOTE: room for every kill's pages: the space of pages a switch lost is not given back
        segment_mb = max(64, (args.pages * page >> 20) * (args.runs * len(settles) + 1))
        cfg = StoreConfig(master_address=address, metadata_server=address, global_segment_size_mb=segment_mb,
                          local_buffer_size_mb=16)
        store = KVStore(cfg, page, StoreMetrics(CollectorRegistry()))
        pages = np.random.default_rng(0).integers(0, 256, size=(args.pages, page), dtype=np.uint8)
        store.register_buffer(pages.ctypes.data, pages.nbytes)
        if not store.wait_enabled(WAIT_S):
            raise RuntimeError("the store client did not connect")
        addrs = [pages.ctypes.data + i * page for i in range(args.pages)]
        for settle in settles:
            for run in range(args.runs):
                keys = [f"bench-master-failover/{settle}/{run}/{i}" for i in range(args.pages)]
                got = {"settle_s": settle, **one_kill(masters, view, store, keys, addrs, settle)}
                runs.append(got)
                say(f"settle {settle} s, run {run + 1}/{args.runs}: new term in etcd after {got['lead_s']} s, serving "
                    f"after {got['serving_s']} s, first full hit after {got['first_hit_s']} s "
                    f"({got['hit_after_serving_s']} s after serving), {got['readable_after']:.0%} of the pages readable, "
                    f"{got['missed_loads']} loads missed meanwhile; the audit found {got['lost_pages']} pages lost "
                    f"after {got['audit_s']} s, {got['restored_pages']} written again "
                    f"({got['restored_pages_per_s']} pages/s)")
        control = setup_control(cfg, leader_of(masters, view)[0])
        say(f"control: a fresh client's setup alone took {control['setup_ha_s']} s against {address}, "
            f"{control['setup_direct_s']} s against the leader's own address")
    finally:
        if store is not None:
            store.close()
        for m in masters:
            m.stop()
        etcd.terminate()
        etcd.wait(timeout=10)

    def med(rows, key: str):
        values = [r[key] for r in rows if r[key] is not None]
        return round(statistics.median(values), 3) if values else None

    out = {"bench": "master_failover", "pages": args.pages, "page_kb": args.page_kb, "runs": runs,
           "control": control, "commit": commit(), "by_settle": {}}
    print(f"\nmaster failover ({args.pages} pages of {args.page_kb} KiB per kill, {commit()}; seconds from the kill)")
    print(f"{'settle s':>8} {'kills':>5} {'term p50':>8} {'serving p50':>11} {'first hit p50':>13} "
          f"{'hit-serving p50':>15} {'readable min':>12} {'kills w/ loss':>13} {'restored/s p50':>14}")
    for settle in sorted({r["settle_s"] for r in runs}):
        rows = [r for r in runs if r["settle_s"] == settle]
        row = {"lead_s_median": med(rows, "lead_s"), "serving_s_median": med(rows, "serving_s"),
               "first_hit_s_median": med(rows, "first_hit_s"),
               "hit_after_serving_s_median": med(rows, "hit_after_serving_s"),
               "readable_after_min": min(r["readable_after"] for r in rows),
               "kills_with_lost_pages": sum(1 for r in rows if r["lost_pages"]),
               "restored_pages_per_s_median": med(rows, "restored_pages_per_s")}
        out["by_settle"][str(settle)] = row
        print(f"{settle:>8} {len(rows):>5} {row['lead_s_median']!s:>8} {row['serving_s_median']!s:>11} "
              f"{row['first_hit_s_median']!s:>13} {row['hit_after_serving_s_median']!s:>15} "
              f"{row['readable_after_min']:>12.1%} {row['kills_with_lost_pages']:>13} "
              f"{row['restored_pages_per_s_median']!s:>14}")
    print(f"control, one client's setup alone: {control['setup_ha_s']} s against the HA address, "
          f"{control['setup_direct_s']} s against the leader's own")
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
