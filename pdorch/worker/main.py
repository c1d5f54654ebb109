"""The process entry point shared by `python -m prefill_node` and `python -m decode_node`.

Parses `--config FILE` / `--set section.key=value`, sets torch threads, builds the worker, serves
gRPC on `{role}.host:port` and Prometheus on `{role}.metrics_port`, registers in etcd when
`discovery.mode == "etcd"`, and shuts everything down in order on SIGTERM / SIGINT:

    leave etcd          routers (and their new requests) stop coming; streams open go on
    drain               a decode worker streams on for decode.drain_timeout_s, then hands what is left to
                        other decode workers (DecodeWorker.drain); a prefill worker's calls get
                        prefill.drain_timeout_s to finish (the server refuses new ones meanwhile)
    end the KV event streams (WatchKV), stop the server
    write back         the L1 pages the store lacks, for {role}.drain_writeback_s (pdorch/worker/drain.py)
    stop the metrics server, the worker
"""

from __future__ import annotations

import argparse
import concurrent.futures
import faulthandler
import gc
import logging
import signal
import threading

import grpc
from prometheus_client import Counter

from pdorch.config import GrpcConfig
from pdorch.config_loader import ConfigError, add_config_args, config_from_args, exit_on_config_error
from pdorch.stop_signal import stop_on_signals, wait_for_stop
from pdorch.tracing import set_process_tracing, setup_tracing
from pdorch.tracing.log_filter import install_trace_ids
from pdorch.worker.drain import WorkerDrain
from pdorch.worker.kv_events import MAX_SUBSCRIBERS
from pdorch.worker.rpc import add_port, server_interceptors
from pdorch.worker.runtime import configure_torch

log = logging.getLogger(__name__)

WILDCARD_HOSTS = ("0.0.0.0", "::", "")

GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.so_reuseport", 0),
    # The ping policy, explicit (grpc-core's default permits a client ping every 5 minutes and
    # answers GOAWAY "too_many_pings" after 2 strikes, which would cut a long silent prefill).
    # Our clients ping at most every 10 s (router/grpc/stream.py, the router's grpc.aio channels)
    # or 5 s (decode_node/prefill_client.py); 4 s leaves them margin. With calls open or not.
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 4000),
    ("grpc.http2.max_ping_strikes", 2),
    # The worker's own pings find a caller that vanished without closing its connection (a
    # partition): its calls are cancelled, so their pages are freed long before their deadline.
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.http2.max_pings_without_data", 0),
]


def make_server(rpc: GrpcConfig, max_rpcs: int, on_refused=None, thread_init=None) -> grpc.Server:
    """The worker's gRPC server (not started, no port yet: `rpc.add_port`). With grpc.token
    every call must carry the token (UNAUTHENTICATED otherwise; `on_refused(method)` counts them).
    `thread_init`: what each handler thread runs first (the worker's device made current)."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max_rpcs, thread_name_prefix="grpc",
                                                 initializer=thread_init)
    return grpc.server(pool,
                       interceptors=server_interceptors(rpc, on_refused), options=GRPC_OPTIONS,
                       maximum_concurrent_rpcs=max_rpcs)


def refusal_counter(role: str, registry) -> Counter:
    """pdorch_{role}_grpc_unauthenticated_total{method}: calls refused for a missing or wrong token
    (a token rotation done right refuses no Prefill or Generate), every method at 0 from the start."""
    counter = Counter(f"pdorch_{role}_grpc_unauthenticated", "Calls refused UNAUTHENTICATED (grpc.token), by "
                      "method", ["method"], registry=registry)
    for method in ("Prefill" if role == "prefill" else "Generate", "Abort", "Flush", "Info", "Stats", "WatchKV"):
        counter.labels(method)
    return counter


def run_worker(role: str, build, argv: list[str] | None = None) -> None:
    """build(cfg, worker_id) -> (worker, add_to_server); the worker has close(), info(), recorder."""
    prog = f"python -m {role}_node"
    parser = argparse.ArgumentParser(prog=prog, description=f"pdorch {role} worker")
    add_config_args(parser)
    args = parser.parse_args(argv)
    try:
        cfg = config_from_args(args)
    except ConfigError as e:
        exit_on_config_error(e, prog)
    log_format = f"%(asctime)s {role} %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=logging.INFO, format=log_format)
    if cfg.observability.otlp_endpoint or cfg.observability.keep_traces:
        install_trace_ids(log_format)  # log lines on a traced RPC's handler thread name its trace
    section = getattr(cfg, role)
    configure_torch(cfg.model.torch_threads)
    address = f"{section.host}:{section.port}"
    # Peers dial what etcd holds: a wildcard listen is reached at the address the pod advertises.
    advertised = f"{cfg.store.local_hostname if section.host in WILDCARD_HOSTS else section.host}:{section.port}"
    worker_id = f"{role}-{cfg.store.local_hostname}-{section.port}"
    # Before the worker is built: its parts read process_tracing() (pdorch/tracing/process.py).
    tracing = setup_tracing(cfg.observability, f"pdorch-{role}", worker_id)
    set_process_tracing(tracing)

    stop = stop_on_signals()
    # SIGUSR2 writes every thread's stack to stderr, from C, without the GIL: the one way to see
    # where a worker hangs when a native call holds the GIL and SIGTERM's handler never runs.
    faulthandler.register(signal.SIGUSR2, all_threads=True)

    from engine.pool_sizing import PoolSizeError
    from pdorch.worker.startup_checks import StartupError

    try:
        worker, add_to_server = build(cfg, worker_id)
    except (StartupError, PoolSizeError) as e:  # what the operator must change, without a traceback
        raise SystemExit("\n".join(f"{prog}: {line}" for line in str(e).splitlines())) from None
    server = _serve_grpc(cfg, role, section, worker, add_to_server, address, prog)
    metrics_server = None
    if section.metrics_port:
        metrics_server, _ = worker.recorder.serve(section.metrics_port, host=section.host)
    drain = WorkerDrain(role, worker, worker.recorder.registry)
    # NOTE: registered last, once the model is loaded and the servers listen: a router sends a worker
    # traffic only once it is in discovery, so a new worker gets none before it is ready.
    registration = _register(cfg, role, worker, worker_id, advertised, section.metrics_port)
    log.info("%s worker %s serving on %s (metrics on %s)", role, worker_id, address, section.metrics_port or "off")
    wait_for_stop(stop)
    log.info("shutting down: leaving discovery, then draining")
    drain.begin()
    if registration is not None:
        registration.stop()
    grace = section.drain_timeout_s
    if hasattr(worker, "drain"):  # the decode worker drains its streams itself (hands them on)
        worker.drain(section.drain_timeout_s)
        grace = 2.0
    worker.kv_events.end_streams()  # WatchKV streams never end by themselves: the grace would run out
    server.stop(grace=grace).wait(grace + 5.0)
    drain.write_back(section.drain_writeback_s)  # after the work: its pages are written back too
    # NOTE: the metrics server's stop waits out its poll interval (0.5 s), the store client's close
    # about 2 s (Mooncake unmounts the segment): side by side, a worker's exit is that much sooner.
    metrics_stop = None
    if metrics_server is not None:
        metrics_stop = threading.Thread(target=metrics_server.shutdown, name="metrics-stop")
        metrics_stop.start()
    worker.close()
    if metrics_stop is not None:
        metrics_stop.join(timeout=5.0)
    tracing.shutdown()  # the last spans exported, within observability.shutdown_timeout_s
    # NOTE: everything is closed; what is left goes with the process. The interpreter's last garbage
    # collection would walk every object torch and the model made (on busy cores 70 % of a worker's exit
    # was in it: docs/benchmarks.md, "The suite's time"): frozen, it skips them; atexit still runs.
    gc.freeze()


def _serve_grpc(cfg, role: str, section, worker, add_to_server, address: str, prog: str):
    """The worker's gRPC server, started on `address`; SystemExit naming the keys when it cannot listen."""
    # Every in-flight RPC holds a thread (Generate streams for their whole life), so size the pool
    # for the admission bound; beyond it gRPC answers RESOURCE_EXHAUSTED instead of queueing blindly.
    # WatchKV streams (one per router replica) hold theirs for good: room for the most it admits.
    max_rpcs = section.max_queued_requests + getattr(section, "max_running_requests", 0) + 16 + MAX_SUBSCRIBERS
    from engine.device import device_initializer

    refused = refusal_counter(role, worker.recorder.registry)
    server = make_server(cfg.grpc, max_rpcs, lambda method: refused.labels(method.rsplit("/", 1)[-1]).inc(),
                         device_initializer(cfg.model.device))
    add_to_server(worker, server)
    try:
        port = add_port(server, address, cfg.grpc)
    except ValueError as e:
        raise SystemExit(f"{prog}: {e}") from None
    if port == 0:
        raise SystemExit(f"{prog}: cannot listen on {address} ({role}.host / {role}.port)")
    server.start()
    return server


def _register(cfg, role: str, worker, worker_id: str, advertised: str, metrics_port: int):
    """The worker's registration in etcd, started (None with static discovery)."""
    if cfg.discovery.mode != "etcd":
        return None
    from pdorch.worker.registration import WorkerRegistration  # lazy: etcd3 only when it is used

    info = worker.info()
    registration = WorkerRegistration(cfg.discovery, role, worker_id, advertised, {
        "address": advertised, "model": cfg.model.served_name, "model_fingerprint": info.model_fingerprint,
        "page_size": info.page_size, "transfer_segment": info.transfer_segment, "metrics_port": metrics_port,
        "tp_size": info.tp_size})
    registration.start()
    return registration
