"""`python -m router --config FILE [--set section.key=value ...]`: run the HTTP router."""

from __future__ import annotations

import argparse
import gc
import logging
import sys

from pdorch.config_loader import ConfigError, add_config_args, config_from_args, exit_on_config_error


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m router", description="pdorch HTTP router (OpenAI + SGLang API)")
    add_config_args(parser)
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = parser.parse_args(argv)
    try:
        cfg = config_from_args(args)
    except ConfigError as e:
        exit_on_config_error(e, "router")
    log_format = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=args.log_level.upper(), format=log_format)
    if cfg.observability.otlp_endpoint or cfg.observability.keep_traces:
        from pdorch.tracing.log_filter import install_trace_ids

        install_trace_ids(log_format)  # a request's log lines name its trace

    import uvicorn

    from engine.prepare import prepare_tokenizer
    from engine.tokenizer import Tokenizer
    from router.http.app import create_app
    from router.http.http_protocol import RouterHttpProtocol
    from router.http.listen import PortInUse, listen_sockets

    rc = cfg.router
    if rc.metrics_port == rc.port:
        print(f"router: router.metrics_port and router.port are both {rc.port}; give /metrics a port of its own "
              "or 0 (served on the HTTP port)", file=sys.stderr)
        return 2
    try:
        sockets = listen_sockets(rc.host, rc.port)
        if rc.metrics_port:  # the same server: RouterApp answers /metrics only there
            sockets += listen_sockets(rc.host, rc.metrics_port, count=1)
    except PortInUse as e:
        print(f"router: {e} (router.port / router.metrics_port / router.host)", file=sys.stderr)
        return 1
    # Only the tokenizer and config.json: the router never converts or loads weights.
    model_dir = prepare_tokenizer(cfg.model.source, cfg.model.cache_dir)
    try:  # model.chat_template is read and tried here (router/http/service.py chat_prompts)
        app = create_app(cfg, Tokenizer.from_dir(model_dir), model_dir)
    except ConfigError as e:
        exit_on_config_error(e, "router")
    # NOTE: access logs off: one log line per request costs more than the routing itself. No
    # X-Forwarded-* rewriting either (nothing reads the client address; it is a layer per request).
    # On SIGTERM uvicorn closes the listening sockets, lets requests in flight (streams) finish
    # for router.drain_timeout_s, then cancels the rest (the chart's preStop hook runs first, so
    # Kubernetes has stopped sending new connections by then: docs/operations.md).
    config = uvicorn.Config(app, log_level=args.log_level, access_log=False, proxy_headers=False,
                            # uvicorn annotates an int but waits with asyncio.wait_for: a float works
                            timeout_graceful_shutdown=rc.drain_timeout_s,  # type: ignore[arg-type]
                            http=RouterHttpProtocol)
    # NOTE: everything loaded so far (tokenizer, FastAPI, pydantic schemas, protobuf) lives as long as
    # the process; frozen, the collector no longer walks it each time the requests' short-lived
    # objects trigger a collection of the older generations (~4% of the router's CPU under load).
    gc.freeze()
    # NOTE: a served request leaves nothing for the collector (reference counting frees it all:
    # tests/unit/test_http_protocol.py), so a young-generation pass walks only the requests in flight
    # (~2,000 objects at 64 streams), all alive, every 700 allocations: 2-3 % of the router's CPU
    # under load, reclaiming nothing. At 10,000 those passes are rare, and what an error path leaves
    # in cycles is still collected.
    gc.set_threshold(10_000, 10, 10)
    uvicorn.Server(config).run(sockets=sockets)  # see router/http/listen.py
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
