"""The `pdorch` command.

    pdorch serve [--model PATH] [--config FILE] [--prefill N] [--decode M] [--exit-on-failure] [--set section.key=value ...]
    pdorch master [--config FILE] [--set ...] [--listen HOST] [--print] [MOONCAKE_FLAGS] [-- MOONCAKE_FLAGS]
    pdorch store-memory [--config FILE] [--set ...] [--port N] [--print]   mooncake_client holding store memory
    pdorch status [--url URL] [--admin-key KEY] [--json]
    pdorch trace REQUEST_ID | --trace-id ID | --slowest N [--url URL] [--json] [--png FILE]   a request's waterfall
    pdorch model prepare [smollm2|PATH] [--cache-dir DIR]
    pdorch config [--config FILE] [--set ...]      print the validated, effective configuration
    pdorch planner [--config FILE] [--set ...] [--once]   size the fleet against planner.* SLOs until SIGTERM
    pdorch bench multiturn|long-context|profile|autoscale [...]   the benchmarks of bench/ (a source checkout)
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import yaml

from pdorch.config_loader import (
    ConfigError,
    add_config_args,
    config_from_args,
    config_to_dict,
    default_config_path,
    exit_on_config_error,
    load_config,
)
from pdorch.master_cmd import add_master_args, run_master, split_passthrough
from pdorch.store_memory import DEFAULT_PORT, run_store_memory
from pdorch.trace_cmd import add_trace_args, run_trace

_SECRETS = (("router", "api_key"), ("router", "admin_key"), ("router", "previous_api_key"), ("grpc", "token"),
            ("grpc", "previous_token"))
# `pdorch bench NAME` -> (module of bench/, one-line help)
BENCHMARKS = {
    "multiturn": ("bench.multiturn.cli", "sustained multi-turn load: hit rate vs ideals, TTFT, tiers, RSS per round"),
    "long-context": ("bench.store_io.long_context", "long shared documents read back from the store vs recomputed"),
    "soak": ("bench.reliability.soak.cli", "N minutes of steady multi-turn traffic: RSS drift per process, errors, leaked pages"),
    "overload": ("bench.reliability.overload", "4x more concurrent requests than admitted: outcomes, rejection latency"),
    "trace": ("bench.trace.cli", "replay a trace (Mooncake, Bailian, aiperf): hit rate vs instant/causal ideals, goodput"),
    "autoscale": ("bench.autoscale", "the planner vs fixed fleets, simulated: SLO intervals met, replica-seconds"),
    "profile": ("bench.profile.cli", "the planner's profile: one prefill and one decode replica's tokens/s and latency"),
    "scale-up-hits": ("bench.scale_up_hits.cli", "a fleet grown 1+1 -> 2+2 vs a fixed 2+2: hit rate, new worker's share, load spread"),
}


def _parser() -> argparse.ArgumentParser:
    # NOTE: allow_abbrev=False everywhere: `--prefil 2` must be an error, not a 2-worker cluster.
    parser = argparse.ArgumentParser(prog="pdorch", description="Prefill/decode disaggregated LLM serving "
                                     "with the Mooncake KV store.", allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = _command(sub, "serve", help="run a local cluster: mooncake_master, workers and the router",
                     description="Run mooncake_master, N prefill and M decode workers and the router "
                     "as child processes until Ctrl-C. Without --config: the embedded configs/local.yaml.")
    serve.add_argument("--model", metavar="PATH", help="serve this Hugging Face model directory (or .gguf file): "
                       "model.source=PATH, served under its directory's name (both overridable with --set)")
    serve.add_argument("--prefill", type=int, default=1, metavar="N", help="prefill workers (default 1)")
    serve.add_argument("--decode", type=int, default=1, metavar="M", help="decode workers (default 1)")
    serve.add_argument("--prefill-tp", type=int, metavar="N", help="tensor-parallel ranks of each prefill worker "
                       "(prefill.tp_size; one GPU each on CUDA)")
    serve.add_argument("--decode-tp", type=int, metavar="N", help="tensor-parallel ranks of each decode worker "
                       "(decode.tp_size; one GPU each on CUDA)")
    serve.add_argument("--routers", type=int, default=1, metavar="R",
                       help="router replicas on router.port + i, all routing to the same workers, as a Kubernetes "
                       "Service spreads clients over a router Deployment's pods (default 1)")
    serve.add_argument("--masters", type=int, default=1, metavar="K",
                       help="mooncake_masters (default 1); K > 1 runs them in HA mode, one leading, against the etcd "
                       "of store.master_address=etcd://host:port (its RPC and metrics ports + i each), or against "
                       "a local etcd serve starts when store.master_address names none")
    serve.add_argument("--autoscale", action="store_true",
                       help="the workers are a local fleet that changes size, driven by the planner section "
                       "(planner.*); --prefill/--decode are the sizes it starts at. The routers find the workers "
                       "through etcd (discovery.mode etcd; a local etcd is started when the config names none); a "
                       "worker taken away drains first (docs/operations.md, \"What a drain guarantees\")")
    serve.add_argument("--log-dir", help="where each component's log goes (default: a new temp dir)")
    serve.add_argument("--startup-timeout", type=float, default=600.0, metavar="S",
                       help="give up if not ready after S seconds (default 600)")
    serve.add_argument("--exit-on-failure", action="store_true",
                       help="stop the whole cluster and exit 1 when a child dies (default: restart it "
                       "with backoff, as Kubernetes would, and keep serving)")

    master = _command(sub, "master", help="run mooncake_master with the flags pdorch expects (from store.* keys)",
                      description="Run mooncake_master in the foreground with its ports and flags from the "
                      "config's store.* keys (bare-metal installs; the Helm chart's master pod runs this too). "
                      "Other arguments (and all after `--`) are mooncake_master flags, passed on as given.")
    add_master_args(master)

    memory = _command(sub, "store-memory", help="run a store-memory node: mooncake_client contributing "
                      "store.memory_node_segment_mb to the store (the Helm chart's storeMemory pods)",
                      description="Run Mooncake's mooncake_client in the foreground: it mounts one segment of "
                      "store.memory_node_segment_mb MiB in the store of store.master_address and serves nothing "
                      "else, so the store's memory stays while workers that are pure clients "
                      "(store.global_segment_size_mb 0) come and go (docs/operations.md).")
    memory.add_argument("--port", type=int, default=DEFAULT_PORT, help="its RPC port, which a readiness probe "
                        f"can check (default {DEFAULT_PORT})")
    memory.add_argument("--print", dest="print_only", action="store_true", help="print the command and exit")

    status = _command(sub, "status", help="workers, load and cache hit rates from a running router")
    status.add_argument("--url", help="router URL (default: from the config's router.host/port)")
    status.add_argument("--admin-key", default=None, help="admin key (default: router.admin_key, "
                        "e.g. env PDORCH_ROUTER_ADMIN_KEY)")
    status.add_argument("--json", action="store_true", help="print the raw status as JSON")

    trace = _command(sub, "trace", help="a request's trace as a waterfall (process, span, start, duration, "
                     "key attributes), from the spans the router and workers keep (observability.keep_traces)")
    add_trace_args(trace)

    model = _command(sub, "model", config=False, help="model management")
    model_sub = model.add_subparsers(dest="model_command", required=True, metavar="SUBCOMMAND")
    # NOTE: no own --help: everything after `prepare` goes to engine.prepare, which documents itself.
    _command(model_sub, "prepare", config=False, add_help=False,
             help="convert a model once into the cache (smollm2, a .gguf file or a HF directory)")

    bench = _command(sub, "bench", config=False, help="benchmarks (from a source checkout)")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True, metavar="BENCHMARK")
    # NOTE: no own --help: everything after the name goes to the benchmark, which documents itself.
    for name, what in BENCHMARKS.items():
        _command(bench_sub, name, config=False, add_help=False, help=what[1])

    planner = _command(sub, "planner", help="size the prefill and decode fleets against planner.ttft_p90_s / "
                       "itl_p90_s (actuator kubernetes or external) until SIGTERM",
                       description="Every planner.interval_s: read the routers' /metrics, predict the next "
                       "interval's load, and decide the replicas per role from the profile (planner.profile_path); "
                       "planner.mode dry-run only logs and exports the decisions (docs/operations.md, Autoscaling).")
    planner.add_argument("--once", action="store_true", help="observe one interval, print the decision as JSON, "
                         "exit (acts on it only in planner.mode act)")

    _command(sub, "config", help="validate a config and print the effective values "
             "(defaults < file < PDORCH_* env < --set); secrets redacted")
    return parser


def _command(sub, name: str, config: bool = True, **kwargs) -> argparse.ArgumentParser:
    """One (sub)command's parser, never abbreviating options; `config`: it takes --config and --set."""
    parser = sub.add_parser(name, allow_abbrev=False, **kwargs)
    if config:
        add_config_args(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = _parser()
    passthrough: list[str] = []
    if argv[:1] == ["master"]:  # everything after `--` goes to mooncake_master
        argv, passthrough = split_passthrough(argv)
    args, rest = parser.parse_known_args(argv)
    if args.command == "model":
        return _model_prepare(rest)
    if args.command == "bench":
        return _bench(args.bench_command, rest)
    if args.command == "master":  # flags pdorch does not know are mooncake_master's (master_cmd.py)
        passthrough, rest = rest + passthrough, []
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if getattr(args, "model", None):  # before the user's own --set, which win; the children get them too
        args.config_overrides = [f"model.source={os.path.abspath(args.model)}", "model.name=",
                                 *args.config_overrides]
    for flag, key in (("prefill_tp", "prefill.tp_size"), ("decode_tp", "decode.tp_size")):
        if getattr(args, flag, None) is not None:  # as --set, which the children get too (the user's own win)
            args.config_overrides = [f"{key}={getattr(args, flag)}", *args.config_overrides]
    try:
        cfg = config_from_args(args, default_path=default_config_path())
    except ConfigError as e:
        exit_on_config_error(e, "pdorch")
    if args.command == "serve":
        return _serve(args, cfg)
    if args.command == "status":
        return _status(args, cfg)
    if args.command == "trace":
        return run_trace(args, cfg)
    if args.command == "master":
        return run_master(cfg, args.listen, args.print_only, passthrough)
    if args.command == "store-memory":
        return run_store_memory(cfg, args.port, args.print_only)
    if args.command == "planner":
        from pdorch.planner.cli import run_planner
        return run_planner(cfg, once=args.once)
    return _show_config(cfg)


def _serve(args, cfg) -> int:
    from pdorch.launcher import LocalCluster, ServeOptions
    config_path = os.path.abspath(args.config) if args.config else str(default_config_path())
    prefill, decode = args.prefill, args.decode
    if args.autoscale:
        from pdorch.planner.in_serve import (
            load_serve_profile,
            planner_port_taken,
            planner_starter,
            starting_sizes,
        )
        try:
            profile = load_serve_profile(cfg)
        except ValueError as e:
            print(f"pdorch serve: {e}", file=sys.stderr)
            return 2
        taken = planner_port_taken(cfg)
        if taken:
            print(f"pdorch serve: {taken}", file=sys.stderr)
            return 2
        prefill, decode = starting_sizes(cfg, prefill, decode)
    opts = ServeOptions(prefill, decode, args.log_dir, args.startup_timeout,
                        restart=not args.exit_on_failure, num_routers=args.routers,
                        num_masters=args.masters, autoscale=args.autoscale)
    try:
        cluster = LocalCluster(cfg, config_path, tuple(args.config_overrides), opts)
        if args.autoscale:
            cluster.attach(planner_starter(cfg, profile, lambda: list(cluster.plan.router_urls), cluster.log_dir))
        return cluster.run()
    except KeyboardInterrupt:  # during model preparation, before any child runs
        print("\npdorch serve: interrupted", file=sys.stderr)
        return 130


def _status(args, cfg) -> int:
    from pdorch import status as st
    host = "127.0.0.1" if cfg.router.host in ("0.0.0.0", "") else cfg.router.host
    url = args.url or f"http://{host}:{cfg.router.port}"
    key = args.admin_key if args.admin_key is not None else cfg.router.admin_key
    try:
        status = st.fetch_status(url, key)
    except st.StatusError as e:
        print(f"pdorch status: {e}", file=sys.stderr)
        return 1
    status["store"] = st.fetch_store(cfg.store)
    st.add_pdorch_evictions(status)
    planner = st.fetch_planner(st.planner_url(cfg.planner))
    if planner is not None:
        status["planner"] = planner
    print(json.dumps(status, indent=2) if args.json else st.render_status(status))
    return 0


def _model_prepare(rest: list[str]) -> int:
    from engine import prepare
    if not any(a == "--cache-dir" or a.startswith("--cache-dir=") for a in rest):
        try:  # the configured cache dir (env PDORCH_MODEL_CACHE_DIR), which the workers read
            cfg = load_config(default_config_path())
        except ConfigError as e:
            exit_on_config_error(e, "pdorch model prepare")
        rest = rest + ["--cache-dir", cfg.model.cache_dir]
    return prepare.main(rest)


def _bench(name: str, rest: list[str]) -> int:
    """Run bench/<module>.main(rest). NOTE: bench/ is not part of the installed package; it is
    found next to this package in a source checkout (and the editable install `make setup` does)."""
    import importlib
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.isfile(os.path.join(root, "bench", "multiturn", "cli.py")):
        print(f"pdorch bench: the benchmarks live in a source checkout (bench/ not found in {root})",
              file=sys.stderr)
        return 2
    if root not in sys.path:
        sys.path.insert(0, root)
    return importlib.import_module(BENCHMARKS[name][0]).main(rest)


def _show_config(cfg) -> int:
    data = config_to_dict(cfg)
    for section, key in _SECRETS:
        if data[section][key]:
            data[section][key] = "<redacted>"
    print(yaml.safe_dump(data, sort_keys=False), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
