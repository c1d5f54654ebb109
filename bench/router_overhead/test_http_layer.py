"""bench/router_overhead/http_layer.py on a few requests: each one is answered whole, in one write per event."""

from __future__ import annotations

import asyncio

from bench.router_overhead.http_layer import EVENTS, _measure


def test_every_request_gets_its_whole_stream():
    res = asyncio.run(_measure(requests=50, repeats=2, warmup=10))
    assert res["writes_per_request"] == EVENTS  # the head leaves with the first event, the end with the last
    assert res["us_per_request"] > 0 and len(res["runs_us"]) == 2
