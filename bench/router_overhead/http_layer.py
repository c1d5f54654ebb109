"""The router's HTTP layer alone: CPU per request of `RouterHttpProtocol` serving a generation route,
in one process on an in-memory transport, with a handler that answers at once.

A request's bytes go in (a new protocol per request, as clients that do not keep connections
make the router do), a 4-event SSE stream comes out; no socket, no worker, no routing. What is
left is what the HTTP layer costs per request: parsing, the request's task, the response's writes.
The machine's speed still moves it (30-50 µs for the same code on this VM from one run to the next),
so compare two trees by alternating them, pair by pair.

    python -m bench.router_overhead http-layer [--requests 5000] [--repeats 7] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import uvicorn
import uvloop
from uvicorn.server import ServerState

from router.http.app import RouterApp
from router.http.hot_path import HotRoutes
from router.http.http_protocol import RouterHttpProtocol
from router.http.sse import SSEResponse
from router.metrics import RouterMetrics

EVENT = b'data: {"text":" w0","output_ids":[1000],"meta_info":{"id":"r","finish_reason":null}}\n\n'
EVENTS = 4


async def _handler(request, body: bytes) -> SSEResponse:
    async def events():
        for _ in range(EVENTS - 1):
            yield EVENT
        yield EVENT + b"data: [DONE]\n\n"

    async def finalize():
        pass

    return SSEResponse(events(), finalize)


def _request() -> bytes:
    body = b'{"input_ids": [' + b", ".join(b"%d" % i for i in range(64)) + b'], "stream": true}'
    return (b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body))


class _Transport:
    """What the protocol writes to: counts writes, completes `done` at the stream's last chunk."""

    def __init__(self, done: asyncio.Future):
        self.done, self.closing, self.writes = done, False, 0

    def write(self, data: bytes) -> None:
        self.writes += 1
        if data.endswith(b"0\r\n\r\n"):
            self.done.set_result(None)

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _measure(requests: int, repeats: int, warmup: int) -> dict:
    app = RouterApp()
    app.state.metrics = RouterMetrics()
    app.hot_routes = HotRoutes({b"/generate": _handler}, app.state.metrics)
    config = uvicorn.Config(app, http=RouterHttpProtocol, log_level="warning", access_log=False, proxy_headers=False)
    config.load()
    state, raw, loop = ServerState(), _request(), asyncio.get_running_loop()

    async def one() -> int:
        transport = _Transport(loop.create_future())
        protocol = RouterHttpProtocol(config=config, server_state=state, app_state={}, _loop=loop)
        protocol.connection_made(transport)
        protocol.data_received(raw)
        await asyncio.wait_for(transport.done, 5)
        protocol.connection_lost(None)
        return transport.writes

    for _ in range(warmup):
        await one()
    runs, writes = [], 0
    for _ in range(repeats):
        t0 = time.thread_time()
        for _ in range(requests):
            writes = await one()
        runs.append((time.thread_time() - t0) / requests * 1e6)
    return {"us_per_request": round(statistics.median(runs), 1), "runs_us": [round(r, 1) for r in runs],
            "writes_per_request": writes, "events": EVENTS, "requests_per_run": requests}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.router_overhead http-layer",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=5000, help="requests per timed run")
    ap.add_argument("--repeats", type=int, default=7, help="timed runs (the median is reported)")
    ap.add_argument("--warmup", type=int, default=2000)
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = ap.parse_args(argv)
    res = uvloop.run(_measure(args.requests, args.repeats, args.warmup))
    if not args.json:
        print(f"HTTP layer: {res['us_per_request']} µs CPU per request (median of {args.repeats} runs of "
              f"{args.requests}; {res['writes_per_request']} writes for {EVENTS} events)")
    print(json.dumps(res))
    return 0

