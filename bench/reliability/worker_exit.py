"""How long a stopped worker takes to exit: a local cluster (tiny random-weights model, one prefill and one
decode worker, with and without a real mooncake_master) started and stopped `--runs` times.

    python -m bench.reliability.worker_exit [--runs 3] [--json]

Per run: the cluster's stop (pdorch/local_stack/workers.py: SIGTERM to both workers at once, each
waited for, then the master's stop) split into the workers' exit and the master's. A worker's exit is
its own shutdown (leave discovery, drain, close the servers and the store client: pdorch/worker/main.py)
and then the interpreter's; a pod's termination and every test cluster's teardown wait for both.
Reported: each run's seconds and their medians.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from engine.prepare import make_tiny_model
from pdorch.local_stack.processes import stop_processes
from pdorch.local_stack.workers import start_cluster


def one_run(tmp: Path, model_dir: Path, with_store: bool) -> dict:
    tmp.mkdir(parents=True)
    cluster = start_cluster(tmp, model_dir, with_store=with_store)
    for ch in cluster.channels:
        ch.close()
    t0 = time.monotonic()
    stop_processes([wp.proc for wp in reversed(cluster.workers)])  # as WorkerCluster.stop, timed apart
    workers_s = time.monotonic() - t0
    master_s = 0.0
    if cluster.master is not None:
        t1 = time.monotonic()
        cluster.master.stop()
        master_s = time.monotonic() - t1
    return {"workers_exit_s": round(workers_s, 3), "master_stop_s": round(master_s, 3),
            "stop_s": round(workers_s + master_s, 3)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.reliability.worker_exit", description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="worker_exit_"))
    try:
        model_dir = make_tiny_model(tmp / "model")
        result: dict = {"runs": args.runs}
        for with_store in (True, False):
            name = "store" if with_store else "no_store"
            runs = [one_run(tmp / f"{name}{i}", model_dir, with_store) for i in range(args.runs)]
            result[name] = {"runs": runs, **{f"median_{k}": round(statistics.median(r[k] for r in runs), 3)
                                              for k in ("workers_exit_s", "master_stop_s", "stop_s")}}
            if not args.json:
                print(f"{name:9s} workers exit {[r['workers_exit_s'] for r in runs]} s, master stop "
                      f"{[r['master_stop_s'] for r in runs]} s; median stop {result[name]['median_stop_s']} s")
        if args.json:
            print(json.dumps(result))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
