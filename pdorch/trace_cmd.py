"""`pdorch trace REQUEST_ID | --trace-id ID | --slowest N [--json] [--png FILE]`: a request's waterfall,
from the router's /admin/traces (which gathers the workers' spans; observability.keep_traces)."""

from __future__ import annotations

import json
import sys
import urllib.parse

from pdorch.status import StatusError, _get
from pdorch.tracing.waterfall import draw_png, render


def add_trace_args(parser) -> None:
    parser.add_argument("request_id", nargs="?", help="the request's id (the response's `id` without its "
                        "chatcmpl-/cmpl- prefix, or the request_id / rid the client gave)")
    parser.add_argument("--trace-id", help="the trace's id (32 hex digits: the response's traceparent header)")
    parser.add_argument("--slowest", type=int, metavar="N", help="the N slowest traces the router keeps")
    parser.add_argument("--url", help="router URL (default: from the config's router.host/port)")
    parser.add_argument("--admin-key", default=None, help="admin key (default: router.admin_key)")
    parser.add_argument("--json", action="store_true", help="print the traces as JSON")
    parser.add_argument("--png", metavar="FILE", help="also draw the waterfall into FILE (needs matplotlib); "
                        "with --slowest, FILE gets -1, -2, ... before its suffix")


def run_trace(args, cfg) -> int:
    given = [x is not None for x in (args.request_id, args.trace_id, args.slowest)]
    if sum(given) != 1:
        print("pdorch trace: give one of REQUEST_ID, --trace-id or --slowest N", file=sys.stderr)
        return 2
    host = "127.0.0.1" if cfg.router.host in ("0.0.0.0", "") else cfg.router.host
    url = (args.url or f"http://{host}:{cfg.router.port}").rstrip("/")
    key = args.admin_key if args.admin_key is not None else cfg.router.admin_key
    if args.slowest is not None:
        path = f"/admin/traces?slowest={args.slowest}"
    elif args.trace_id is not None:
        path = f"/admin/traces/{urllib.parse.quote(args.trace_id, safe='')}"
    else:
        path = f"/admin/traces?request_id={urllib.parse.quote(_bare_id(args.request_id), safe='')}"
    try:
        body = json.loads(_get(url + path, key, cfg.observability.traces_rpc_timeout_s + 5.0))
    except StatusError as e:
        print(f"pdorch trace: {e}", file=sys.stderr)
        return 1
    traces = body["traces"] if args.slowest is not None else [body]
    if args.json:
        print(json.dumps(body, indent=2))
    else:
        print("\n\n".join(render(t) for t in traces) if traces else "no traces kept yet")
    if args.png:
        return _pngs(traces, args.png)
    return 0


def _bare_id(request_id: str) -> str:
    """The id the router knows: the OpenAI response id's prefix (chatcmpl-, cmpl-) removed."""
    for prefix in ("chatcmpl-", "cmpl-"):
        if request_id.startswith(prefix):
            return request_id[len(prefix):]
    return request_id


def _pngs(traces: list[dict], path: str) -> int:
    stem, dot, suffix = path.rpartition(".") if "." in path else (path, "", "")
    try:
        for i, trace in enumerate(traces):
            target = path if len(traces) == 1 else f"{stem}-{i + 1}{dot}{suffix}"
            draw_png(trace, target)
            print(f"wrote {target}", file=sys.stderr)
    except ImportError:
        print("pdorch trace: --png needs matplotlib (pip install matplotlib); the waterfall above is the "
              "same trace as text", file=sys.stderr)
        return 1
    return 0
