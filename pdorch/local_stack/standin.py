"""A fast stand-in for the prefill/decode workers (router tests and bench/router_overhead/).

It speaks the real gRPC protocol (proto/pdorch/v1/worker.proto) but runs no model: Generate
streams `max_tokens` synthetic tokens (id 1000+i, text " w{i}") as fast as it can. Behaviour
knobs (`Behavior`) inject failures before the first token or mid-stream, delays, and record
every call and every cancellation, so tests can assert routing, retries and disconnects.

    python -m pdorch.local_stack.standin --role decode --port 50171   # a separate process (benchmarks)
    StandinServer("decode", port).start() ... .stop()             # a thread in the test process
"""

from __future__ import annotations

import argparse
import asyncio
import threading
from dataclasses import dataclass, field

import grpc

from proto.pdorch.v1 import worker_pb2, worker_pb2_grpc
from store_client.page_hash import page_hashes


@dataclass
class Behavior:
    page_size: int = 16
    max_context_tokens: int = 2048
    total_pages: int = 1024  # the KV pool Info reports
    # Generate: before the chunks of these tokens, a `paused` chunk (a preemption), then `pause_s` of
    # silence; the token's chunk reports the pause as 0.5 s
    preempted_at: tuple[int, ...] = ()
    pause_s: float = 0.0
    model: str = "SmolLM2-135M-Instruct"
    fail_before_first: int = 0  # this many next Generate/Prefill calls fail with UNAVAILABLE
    fail_code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE
    fail_after_tokens: int | None = None  # Generate aborts after streaming this many tokens ...
    fail_after_code: grpc.StatusCode = grpc.StatusCode.INTERNAL  # ... with this code
    # Token i of a request with n prompt tokens is 1000 + n + i (else 1000 + i): a request resumed
    # with prompt + streamed tokens continues the same sequence.
    position_tokens: bool = False
    first_token_delay_s: float = 0.0
    token_delay_s: float = 0.0
    call_prefill: bool = False  # D calls Prefill on the prefill_address it was given
    cached_device: int = 0  # Prefill reports this many L1-cached prompt tokens
    cached_store: int = 0
    calls: list = field(default_factory=list)  # requests received (GenerateRequest / PrefillRequest)
    cancelled: list = field(default_factory=list)  # request ids whose stream the caller cancelled
    flushes: int = 0
    # WatchKV: a snapshot, then the page hashes of every Prefill as l1_stored (a cut every 50 ms, a
    # heartbeat every second), as a worker streams them. `kv_script`: per subscription, the batches
    # to send instead (then the stream stays open); `kv_events=False`: UNIMPLEMENTED (an old worker).
    kv_events: bool = True
    kv_script: list = field(default_factory=list)  # list of lists of KVEventBatch
    kv_subscriptions: list = field(default_factory=list)  # WatchKVRequests received
    kv_pending: list = field(default_factory=list)  # page hashes not yet published


# The RPCs both stand-ins answer alike (each servicer sets `role` and `flush_pages`).
async def _info_rpc(self, request, context) -> worker_pb2.WorkerInfo:
    b = self.b
    return worker_pb2.WorkerInfo(role=self.role, worker_id=self.worker_id, model=b.model, page_size=b.page_size,
                                 total_pages=b.total_pages, free_pages=b.total_pages,
                                 max_context_tokens=b.max_context_tokens)


async def _flush_rpc(self, request, context) -> worker_pb2.FlushResponse:
    self.b.flushes += 1
    return worker_pb2.FlushResponse(pages_freed=self.flush_pages)


async def _abort_rpc(self, request, context) -> worker_pb2.AbortResponse:
    return worker_pb2.AbortResponse(found=False)


async def _watch_kv_rpc(self, request, context):
    b = self.b
    if not b.kv_events:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "stand-in: no WatchKV")
    b.kv_subscriptions.append(request)
    if b.kv_script:
        for batch in b.kv_script.pop(0):
            yield batch
        await asyncio.sleep(3600)  # the caller ends it
    epoch, seq, quiet = f"{self.worker_id}-epoch", 1, 0.0
    yield worker_pb2.KVEventBatch(worker_id=self.worker_id, epoch=epoch, seq=seq, snapshot=True,
                                  page_size=b.page_size, free_pages=1024)
    while True:
        await asyncio.sleep(0.05)
        quiet += 0.05
        if b.kv_pending or quiet >= 1.0:
            stored, b.kv_pending[:] = list(b.kv_pending), []
            seq, quiet = seq + 1, 0.0
            yield worker_pb2.KVEventBatch(worker_id=self.worker_id, epoch=epoch, seq=seq, l1_stored=stored,
                                          page_size=b.page_size, free_pages=1024)


class StandinPrefill(worker_pb2_grpc.PrefillServiceServicer):
    def __init__(self, b: Behavior, worker_id: str):
        self.b, self.worker_id = b, worker_id

    async def Prefill(self, request, context):
        b = self.b
        b.calls.append(request)
        b.kv_pending.extend(request.page_hashes)
        try:
            if b.fail_before_first > 0:
                b.fail_before_first -= 1
                await context.abort(b.fail_code, "stand-in prefill: injected failure")
            if b.first_token_delay_s:
                await asyncio.sleep(b.first_token_delay_s)
        except asyncio.CancelledError:
            b.cancelled.append(request.request_id)
            raise
        return worker_pb2.PrefillResponse(
            request_id=request.request_id, first_token_id=1000, prompt_tokens=len(request.token_ids),
            cached=worker_pb2.CachedTokens(device=b.cached_device, store=b.cached_store))

    role, flush_pages = "prefill", 3
    Info, Flush, Abort, WatchKV = _info_rpc, _flush_rpc, _abort_rpc, _watch_kv_rpc


class StandinDecode(worker_pb2_grpc.DecodeServiceServicer):
    def __init__(self, b: Behavior, worker_id: str):
        self.b, self.worker_id = b, worker_id
        self._prefill_stubs: dict[str, worker_pb2_grpc.PrefillServiceStub] = {}

    async def _prefill(self, request) -> worker_pb2.PrefillResponse:
        stub = self._prefill_stubs.get(request.prefill_address)
        if stub is None:
            stub = worker_pb2_grpc.PrefillServiceStub(grpc.aio.insecure_channel(request.prefill_address))
            self._prefill_stubs[request.prefill_address] = stub
        return await stub.Prefill(worker_pb2.PrefillRequest(
            request_id=request.request_id, token_ids=request.token_ids, sampling=request.sampling,
            page_size=self.b.page_size, page_hashes=page_hashes(request.token_ids, self.b.page_size)), timeout=30)

    async def Generate(self, request, context):
        b = self.b
        b.calls.append(request)
        n = max(1, request.sampling.max_tokens)
        cached = worker_pb2.CachedTokens(device=b.cached_device, store=b.cached_store)
        try:
            if b.fail_before_first > 0:
                b.fail_before_first -= 1
                await context.abort(b.fail_code, "stand-in decode: injected failure")
            if b.call_prefill:
                try:
                    cached = (await self._prefill(request)).cached
                except grpc.aio.AioRpcError as e:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, f"prefill failed: {e.details()}")
            if b.first_token_delay_s:
                await asyncio.sleep(b.first_token_delay_s)
            for i in range(n):
                if i and b.token_delay_s:  # NOTE: between tokens only; the stream ends right after the last
                    await asyncio.sleep(b.token_delay_s)
                if b.fail_after_tokens is not None and i == b.fail_after_tokens:
                    await context.abort(b.fail_after_code, "stand-in decode: injected mid-stream failure")
                token = 1000 + i + (len(request.token_ids) if b.position_tokens else 0)
                if i in b.preempted_at:
                    yield worker_pb2.GenerateResponse(request_id=request.request_id, prompt_tokens=len(request.token_ids),
                                                      preemptions=1, paused=True)
                    await asyncio.sleep(b.pause_s)
                yield worker_pb2.GenerateResponse(
                    request_id=request.request_id, token_ids=[token], text=f" w{token - 1000}",
                    prompt_tokens=len(request.token_ids), cached=cached,
                    finish_reason="length" if i == n - 1 else "", paused_s=0.5 if i in b.preempted_at else 0.0)
        except (asyncio.CancelledError, GeneratorExit):
            # NOTE: GeneratorExit too: a cancel that comes while grpc still writes the last message yielded
            # cancels grpc's write, not this generator, which grpc then closes at its `yield`
            b.cancelled.append(request.request_id)
            raise

    role, flush_pages = "decode", 5
    Info, Flush, Abort, WatchKV = _info_rpc, _flush_rpc, _abort_rpc, _watch_kv_rpc


async def serve(role: str, port: int, b: Behavior, worker_id: str = "", ready: threading.Event | None = None,
                stop: asyncio.Event | None = None) -> None:
    server = grpc.aio.server()
    wid = worker_id or f"standin-{role}-{port}"
    if role == "prefill":
        worker_pb2_grpc.add_PrefillServiceServicer_to_server(StandinPrefill(b, wid), server)
    else:
        worker_pb2_grpc.add_DecodeServiceServicer_to_server(StandinDecode(b, wid), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    if ready is not None:
        ready.set()
    try:
        if stop is None:
            await server.wait_for_termination()
        else:
            await stop.wait()
    finally:
        await server.stop(grace=None)


class StandinServer:
    """A stand-in worker on its own event loop thread (for tests in the same process)."""

    def __init__(self, role: str, port: int, behavior: Behavior | None = None):
        self.role, self.port = role, port
        self.behavior = behavior or Behavior()
        self.address = f"127.0.0.1:{port}"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    def start(self, timeout_s: float = 10.0) -> StandinServer:
        ready = threading.Event()

        def run():
            self._loop = asyncio.new_event_loop()
            self._stop = asyncio.Event()
            self._loop.run_until_complete(serve(self.role, self.port, self.behavior, ready=ready, stop=self._stop))
            self._loop.close()

        self._thread = threading.Thread(target=run, name=f"standin-{self.role}-{self.port}", daemon=True)
        self._thread.start()
        if not ready.wait(timeout_s):
            raise TimeoutError(f"stand-in {self.role} on port {self.port} did not start within {timeout_s}s")
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)
        self._thread = None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pdorch.local_stack.standin", description=__doc__.splitlines()[0])
    ap.add_argument("--role", choices=["prefill", "decode"], required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--token-delay-s", type=float, default=0.0)
    args = ap.parse_args(argv)
    try:  # NOTE: uvloop roughly halves the stand-in's CPU per stream (it shares cores with the router)
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    runner(serve(args.role, args.port, Behavior(token_delay_s=args.token_delay_s)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
