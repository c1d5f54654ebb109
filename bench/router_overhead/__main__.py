"""`python -m bench.router_overhead`: the study's one entry. Without a sub-command it runs the
comparison (compare.py: the control, both routers, the added latency and CPU per request); the
other studies of the same question are its sub-commands, each with its own flags.

    python -m bench.router_overhead [--json] [...]             the comparison (compare.py)
    python -m bench.router_overhead ttft-path [--json] [...]   the added TTFT step by step (ttft_path.py)
    python -m bench.router_overhead pick [--json] [...]        the worker choice at fleet scale (pick.py)
    python -m bench.router_overhead http-layer [--json] [...]  the HTTP layer alone (http_layer.py)
    python -m bench.router_overhead responses [--json] [...]   /v1/responses against chat (responses.py)
    python -m bench.router_overhead tracing [--json] [...]     what tracing adds to TTFT (tracing.py)
    python -m bench.router_overhead profile [--json] [...]     where the router's CPU per request goes (profile.py)
    python -m bench.router_overhead cold [--json] [...]        the steps before the call, caches evicted (cold_steps.py)
"""

import importlib
import sys

STUDIES = {"ttft-path": "ttft_path", "pick": "pick", "http-layer": "http_layer", "responses": "responses", "tracing": "tracing",
           "profile": "profile", "cold": "cold_steps"}


def main(argv: list[str]) -> int:
    # NOTE: a sub-command only as the first word: the comparison's flags stay as they were.
    if argv[:1] and argv[0] in STUDIES:
        return importlib.import_module(f"bench.router_overhead.{STUDIES[argv[0]]}").main(argv[1:])
    return importlib.import_module("bench.router_overhead.compare").main(argv)


raise SystemExit(main(sys.argv[1:]))
