"""Timestamps along one request's path to its first token, inside a router process.

ttft_path.py starts the pdorch router and the control (floor.py) through
this module; it wraps, before the server starts, the few functions every request passes:

    conn    the connection's protocol is made (accept)
    head    the request head is parsed (router: HotCycle made; floor: the read that completed it)
    task    the request's task starts
    call    the Generate call is begun (router/grpc/stream.py Channel.call)
    sent    HEADERS + DATA are written to the worker's connection (Channel.call returns)
    data    the first DATA of the call is parsed (the event loop read the worker's first token)
    resume  the task has the first token (StreamCall.next_batch returns)
    write   the response's first bytes are written to the client (head + first event)

and, in the router, the time the handler spends in each step of HANDLER_STEPS. On SIGUSR1 it
writes the records of the requests completed since the last dump to `$TTFT_TRACE_DIR/<name>.json`.
Each wrapper costs a few µs, alike in both processes: compare the two, not with untraced runs.

    python -m bench.router_overhead.ttft_tracer ours -m router --config FILE ...
    python -m bench.router_overhead.ttft_tracer floor -m bench.router_overhead.floor --port P --decode ADDR
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import json
import os
import runpy
import signal
import sys
from pathlib import Path
from time import perf_counter

from router.grpc.call import StreamCall
from router.grpc.stream import Channel

STEPS = ("conn", "head", "task", "call", "sent", "data", "resume", "write")
# (module, attribute) of what the router's handler does before the Generate call, timed per request
HANDLER_STEPS = (
    ("router.http.hot_path", "HotRequest.__init__"), ("router.http.auth", "Auth.check_client"),
    ("router.http.generation", "GenerationHandlers.generate_job"), ("router.http.generation", "parse"),
    ("router.http.generation", "sglang_sampling"),
    ("router.http.service", "RouterService._job"), ("router.dispatch.policies", "page_hashes"),
    ("router.http.service", "Progress.__init__"),
    ("router.dispatch.policies", "Policy.route"), ("router.dispatch.policies", "CacheAware.choose"),
    ("router.dispatch.policies", "CacheAware.choose_decode"), ("router.dispatch.policies", "CacheAware.on_routed"),
    ("router.dispatch.policies", "CacheAware.load_changed"), ("router.metrics", "RouterMetrics.routed_to"),
)

_by_task: dict[asyncio.Task, dict] = {}
_by_call: dict[int, dict] = {}
_done: list[dict] = []


def _trace_grpc() -> None:
    call, on_data, next_batch = Channel.call, StreamCall._on_data, StreamCall.next_batch

    async def traced_call(self, *args, **kwargs):
        rec = _by_task.get(asyncio.current_task())
        if rec is None:  # not a request's task (a health probe, a KV watch): not traced
            return await call(self, *args, **kwargs)
        rec.setdefault("call", perf_counter())
        stream = await call(self, *args, **kwargs)
        rec.setdefault("sent", perf_counter())
        _by_call[id(stream)] = rec
        rec.setdefault("_calls", []).append(id(stream))  # forgotten when the request's task ends
        return stream

    def traced_on_data(self, data):
        rec = _by_call.get(id(self))
        if rec is not None:
            rec.setdefault("data", perf_counter())
        return on_data(self, data)

    async def traced_next_batch(self):
        batch = await next_batch(self)
        rec = _by_call.get(id(self))
        if rec is not None:
            rec.setdefault("resume", perf_counter())
        return batch

    Channel.call, StreamCall._on_data, StreamCall.next_batch = traced_call, traced_on_data, traced_next_batch


def _trace_protocol(cls, on_head: str) -> None:
    """`cls.__init__` marks the connection, `cls.<on_head>` the request head."""
    init, head = cls.__init__, getattr(cls, on_head)

    def traced_init(self, *args, **kwargs):
        self._trace_conn = perf_counter()
        init(self, *args, **kwargs)

    def traced_head(self, *args, **kwargs):
        self._trace_head = perf_counter()
        return head(self, *args, **kwargs)

    cls.__init__ = traced_init
    setattr(cls, on_head, traced_head)


class _FirstWrite:
    """The request's transport, noting its first write."""

    def __init__(self, transport, rec: dict):
        self._transport, self._rec = transport, rec

    def write(self, data) -> None:
        self._rec.setdefault("write", perf_counter())
        self._transport.write(data)

    def __getattr__(self, name):
        return getattr(self._transport, name)


def _trace_task(cls, method: str, protocol_of) -> None:
    """`cls.<method>` is the request's task: it starts a record and ends it."""
    run = getattr(cls, method)

    async def traced(self, *args, **kwargs):
        rec = _by_task[asyncio.current_task()] = {}
        protocol = protocol_of(self)
        rec.update(conn=protocol._trace_conn, head=protocol._trace_head, task=perf_counter())
        transport = self.transport
        self.transport = _FirstWrite(transport, rec)
        try:
            return await run(self, *args, **kwargs)
        finally:
            self.transport = transport
            _by_task.pop(asyncio.current_task(), None)
            for call_id in rec.pop("_calls", ()):
                _by_call.pop(call_id, None)
            if all(s in rec for s in STEPS):
                _done.append(rec)

    setattr(cls, method, traced)


def _time_handler_steps() -> None:
    for module_name, path in HANDLER_STEPS:
        owner = importlib.import_module(module_name)
        *outer, attr = path.split(".")
        for name in outer:
            owner = getattr(owner, name)
        fn = getattr(owner, attr)

        @functools.wraps(fn)
        def timed(*args, _fn=fn, _key="us:" + path, **kwargs):
            t0 = perf_counter()
            try:
                return _fn(*args, **kwargs)
            finally:
                rec = _by_task.get(asyncio.current_task())
                if rec is not None:
                    rec[_key] = rec.get(_key, 0.0) + (perf_counter() - t0) * 1e6

        setattr(owner, attr, timed)


def _dump(name: str) -> None:
    out = Path(os.environ.get("TTFT_TRACE_DIR", ".")) / f"{name}.json"
    partial = out.with_suffix(".partial")
    partial.write_text(json.dumps(_done))
    os.replace(partial, out)  # the reader waits for the name: it sees the whole file or none
    _done.clear()


def main() -> None:
    name, argv = sys.argv[1], sys.argv[2:]
    signal.signal(signal.SIGUSR1, lambda *_: _dump(name))
    _trace_grpc()
    if name == "ours":
        from router.http import hot_path, http_protocol

        _trace_protocol(http_protocol.RouterHttpProtocol, "_start_hot")
        # NOTE: the protocol's `cycle` is the request's HotCycle; it reads the marks off its protocol
        init = hot_path.HotCycle.__init__

        def init_with_protocol(self, protocol, *args, **kwargs):
            init(self, protocol, *args, **kwargs)
            self._trace_protocol = protocol

        hot_path.HotCycle.__init__ = init_with_protocol
        _trace_task(hot_path.HotCycle, "_serve", lambda cycle: cycle._trace_protocol)
        _time_handler_steps()
        sys.argv = ["router", *argv[2:]]  # argv: -m router ...
        runpy.run_module("router", run_name="__main__", alter_sys=True)
    else:
        floor = importlib.import_module(argv[1])  # argv: -m bench.router_overhead.floor ...
        protocol = floor.FloorProtocol
        _trace_protocol(protocol, "data_received")
        _trace_task(protocol, "serve", lambda p: p)
        sys.argv = [argv[1], *argv[2:]]
        raise SystemExit(floor.main())


if __name__ == "__main__":
    main()
