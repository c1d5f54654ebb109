"""`python -m pdorch.worker.tp_follower`: one follower rank of a tensor-parallel worker, started and
owned by rank 0 (pdorch/worker/tp_group.py); never started by hand.

It loads its shard of the model, sizes and registers its pool with its own transfer engine and
store client (objects of its KV heads only), serves its share of rank 0's I/O on loopback gRPC
(tp_io.FollowerIO), and does rank 0's steps until "stop" (tp_steps.follow). It exits when rank 0
stops it, when rank 0 is gone (a collective fails, or its parent process changed), or on any error:
the worker is then restarted as a group.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import faulthandler
import logging
import os
import signal
import threading

from pdorch.config_loader import load_config

log = logging.getLogger(__name__)

PARENT_POLL_S = 1.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pdorch.worker.tp_follower")
    ap.add_argument("--config", required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--init", required=True)
    ap.add_argument("--num-pages", type=int, required=True)
    ap.add_argument("--component", default="")
    ap.add_argument("--no-store", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s tp-rank{args.rank} %(levelname)s %(name)s: %(message)s")
    faulthandler.register(signal.SIGUSR2, all_threads=True)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # rank 0 owns the group's shutdown
    _watch_parent(os.getppid())
    try:
        run(args)
    except BaseException as e:  # noqa: BLE001 - the group is broken: exit, rank 0 follows
        log.critical("TP rank %d exits: %s: %s", args.rank, type(e).__name__, e)
        logging.shutdown()
        os._exit(70)
    logging.shutdown()
    os._exit(0)  # NOTE: past a process group's teardown, interpreter exit can hang in native atexit code


def run(args) -> None:
    import grpc

    from engine.device import device_initializer, use_device
    from engine.model_runner import ModelRunner
    from engine.tensor_parallel import TPShard, init_tp_group
    from pdorch.worker.runtime import configure_torch, load_shard, make_store, prepare, start_transfer
    from pdorch.worker.tp_group import backend_for, exchange, rank_device
    from pdorch.worker.tp_io import FollowerIO
    from pdorch.worker.tp_steps import StepChannel, follow
    from pdorch.worker.tp_transfer import PoolRank
    from proto.pdorch.v1 import tp_pb2_grpc
    from store_client.metrics import StoreMetrics

    cfg = load_config(args.config)
    device = rank_device(cfg.model.device, args.rank)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, device=device))
    use_device(device)  # before any kernel, graph or stream (engine/device.py)
    configure_torch(cfg.model.torch_threads)
    group = init_tp_group(args.rank, args.size, args.init, backend_for(device), cfg.model.tp_timeout_s)
    model_dir, dtypes = prepare(cfg, args.size)
    shard = TPShard(args.rank, args.size)
    arch, model, pool, _ = load_shard(cfg, model_dir, dtypes, args.num_pages, shard, group)
    transfer, segment = start_transfer(cfg, pool)
    heads = shard.kv_heads(arch)
    store = None
    if not args.no_store and cfg.store.enabled:
        from prometheus_client import CollectorRegistry

        store = make_store(cfg, pool, StoreMetrics(CollectorRegistry()), args.component, arch.num_kv_heads, heads)
        store.register_buffer(pool.base_ptr, pool.nbytes)
    # NOTE: loopback only, reached by rank 0 alone: no token or TLS (grpc.*), which guard the worker's own port
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(32, thread_name_prefix="tp-io",  # store, transfers
                                                               initializer=device_initializer(device)))
    io = FollowerIO(args.rank, [], pool, store, transfer)
    tp_pb2_grpc.add_TPFollowerServicer_to_server(io, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        io.ranks, _ = exchange(group, PoolRank(segment, pool.base_ptr, pool.page_nbytes, heads), f"127.0.0.1:{port}")
        log.info("TP rank %d of %d ready: KV heads %d..%d, %d pages, segment %s", args.rank, args.size, heads.start,
                 heads.stop - 1, pool.num_pages, segment)
        follow(StepChannel(group, on_broken=lambda e: None), ModelRunner(model, model.local_arch, pool,
                                                                          cfg.model.attention_backend))
        log.info("TP rank %d: stopped by rank 0", args.rank)
    finally:
        server.stop(grace=1.0).wait(3.0)
        if store is not None:
            store.close()
        transfer.close()


def _watch_parent(parent: int) -> None:
    """Exit when rank 0 (our parent) is gone, even if no collective is waiting to notice."""
    def watch():
        while True:
            threading.Event().wait(PARENT_POLL_S)
            if os.getppid() != parent:
                log.critical("rank 0 (pid %d) is gone: exiting", parent)
                os._exit(70)
    threading.Thread(target=watch, name="tp-parent", daemon=True).start()


if __name__ == "__main__":
    raise SystemExit(main())
