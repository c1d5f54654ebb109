"""`python -m router --config FILE [--set section.key=value ...]`: run the HTTP router."""

from __future__ import annotations

import argparse
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
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    import uvicorn

    from engine.prepare import prepare_tokenizer
    from engine.tokenizer import Tokenizer
    from router.app import create_app
    from router.http_protocol import RouterHttpProtocol
    from router.listen import PortInUse, listen_sockets

    try:
        sockets = listen_sockets(cfg.router.host, cfg.router.port)
    except PortInUse as e:
        print(f"router: {e} (router.port / router.host)", file=sys.stderr)
        return 1
    # Only the tokenizer and config.json: the router never converts or loads weights.
    model_dir = prepare_tokenizer(cfg.model.source, cfg.model.cache_dir)
    app = create_app(cfg, Tokenizer.from_dir(model_dir), model_dir)
    # NOTE: access logs off: one log line per request costs more than the routing itself. No
    # X-Forwarded-* rewriting either (nothing reads the client address; it is a layer per request).
    config = uvicorn.Config(app, log_level=args.log_level, access_log=False, proxy_headers=False,
                            timeout_graceful_shutdown=30, http=RouterHttpProtocol)
    uvicorn.Server(config).run(sockets=sockets)  # see router/listen.py
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
