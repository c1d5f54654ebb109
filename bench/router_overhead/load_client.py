"""Closed-loop load for the router-overhead study: N clients, each sending back-to-back streaming
requests to one target, timing the first token (TTFT) and the whole stream.

Two client implementations, chosen per run (`--client`):
  lean     (default) a minimal HTTP/1.1 client on asyncio streams (one request per connection
           unless keep-alive) and the router's own lean gRPC client (router/grpc/stream.py) for
           the direct gRPC baseline. The client shares the machine's cores with the routers and
           stand-ins, so the cheaper it is, the less of its own queueing ends up in "overhead".
  aiohttp  aiohttp for HTTP and grpc.aio for gRPC: what earlier rounds measured with.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time

GENERATE_BODY = {"stream": True, "sampling_params": {"temperature": 0.0}, "input_ids": list(range(1, 65))}


class Sample:
    __slots__ = ("e2e", "ttft")

    def __init__(self, ttft: float, e2e: float):
        self.ttft, self.e2e = ttft, e2e


# ------------------------------------------------------------------------------ lean HTTP
class LeanHTTP:
    """POST `path` (/generate) over a raw asyncio stream; reads the chunked SSE body to its end."""

    def __init__(self, url: str, body: bytes, keep_alive: bool, path: str = "/generate"):
        hostport = url.split("://", 1)[1]
        self.host, port = hostport.rsplit(":", 1)
        self.port = int(port)
        self.keep_alive = keep_alive
        self.request = (f"POST {path} HTTP/1.1\r\nHost: {hostport}\r\nContent-Type: application/json\r\n"
                        f"Content-Length: {len(body)}\r\nConnection: {'keep-alive' if keep_alive else 'close'}"
                        "\r\n\r\n").encode() + body

    async def one(self, conn: list) -> Sample:
        """`conn` holds this client's kept connection ([] when none)."""
        t0 = time.perf_counter()
        if not conn:
            conn.extend(await asyncio.open_connection(self.host, self.port))
        reader, writer = conn
        writer.write(self.request)
        ttft = None
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"{self.host}:{self.port}: {head.splitlines()[0].decode()}")
            if b"transfer-encoding: chunked" not in head.lower():
                raise RuntimeError(f"{self.host}:{self.port}: expected a chunked stream, got {head!r}")
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                data = await reader.readexactly(size + 2)
                if size == 0:
                    break
                if ttft is None and b"data: {" in data:
                    ttft = time.perf_counter() - t0
        finally:
            if not self.keep_alive:
                writer.close()
                conn.clear()
        return Sample(ttft or 0.0, time.perf_counter() - t0)


# ------------------------------------------------------------------------------ targets
async def open_target(target: str, tokens: int, keep_alive: bool, client: str,
                      request: tuple[str, dict] | None = None):
    """(one(conn) -> Sample, close()) for `http://host:port` (/generate, or `request`: (path, streaming
    body) of another route) or `grpc://host:port` (Generate)."""
    from proto.pdorch.v1 import worker_pb2 as pb

    body = dict(GENERATE_BODY, sampling_params={"max_new_tokens": tokens, "temperature": 0.0})
    grpc_req = pb.GenerateRequest(request_id="b", token_ids=body["input_ids"], prefill_address="unused",
                                  sampling=pb.SamplingParams(max_tokens=tokens, temperature=0.0))
    path = "/generate"
    if request is not None:
        path, body = request
    if target.startswith("grpc://") and client == "lean":
        from router.dispatch.dispatch import GENERATE_PATH
        from router.grpc.stream import Channel

        channel, data = Channel(target[len("grpc://"):]), grpc_req.SerializeToString()

        async def one(conn) -> Sample:
            t0 = time.perf_counter()
            ttft = None
            call = await channel.call(GENERATE_PATH, data, pb.GenerateResponse.FromString, 60)
            while await call.next_batch():
                if ttft is None:
                    ttft = time.perf_counter() - t0
            return Sample(ttft or 0.0, time.perf_counter() - t0)

        async def close():
            channel.close()

        return one, close
    if target.startswith("grpc://"):
        import grpc

        from proto.pdorch.v1 import worker_pb2_grpc as pbg

        aio_channel = grpc.aio.insecure_channel(target[len("grpc://"):])
        stub = pbg.DecodeServiceStub(aio_channel)

        async def one(conn) -> Sample:
            t0 = time.perf_counter()
            ttft = None
            async for _ in stub.Generate(grpc_req, timeout=60):
                if ttft is None:
                    ttft = time.perf_counter() - t0
            return Sample(ttft or 0.0, time.perf_counter() - t0)

        return one, aio_channel.close
    raw = json.dumps(body).encode()
    if client == "lean":
        http = LeanHTTP(target, raw, keep_alive, path)

        async def close():
            pass

        return http.one, close
    import aiohttp

    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=not keep_alive),
                                    timeout=aiohttp.ClientTimeout(total=60))

    async def one(conn) -> Sample:
        t0 = time.perf_counter()
        ttft = None
        async with session.post(target + path, data=raw, headers={"Content-Type": "application/json"}) as r:
            if r.status != 200:
                raise RuntimeError(f"{target}: HTTP {r.status}: {await r.text()}")
            async for line in r.content:
                if ttft is None and line.startswith(b"data: {"):
                    ttft = time.perf_counter() - t0
        return Sample(ttft or 0.0, time.perf_counter() - t0)

    return one, session.close


async def closed_loop(target: str, concurrency: int, tokens: int, warmup_s: float, duration_s: float,
                      keep_alive: bool = False, stagger_s: float = 0.0, client: str = "lean",
                      think_s: float = 0.0, request: tuple[str, dict] | None = None) -> dict:
    """`concurrency` clients each sending back-to-back requests; stats of those finished in the window.

    Client i starts `i * stagger_s / concurrency` late. NOTE: with stagger 0 and a fixed stream
    length, the closed-loop streams stay in lockstep: every request ends, and its successor's
    first token comes back, inside one burst of 64 stream ends + 64 new requests, so each TTFT
    measures how the client process digests that burst (direct HTTP TTFT p50 17-20 ms with no
    first-token delay) and the router-minus-direct difference is noise of +-10 ms for either
    router. Spreading the starts over one token interval keeps 64 streams open and lets new
    requests arrive at independent phases, as they do against a real server.

    `think_s` > 0: before each request a client waits a random time in [0, think_s) (seeded).
    NOTE: without it the streams drift back into step: a request's successor starts the moment
    its last token arrives, i.e. inside the token burst of every stream in the same phase, and
    the run measures how those bursts line up (the direct gRPC TTFT p50 moved 2.1-4.9 ms between
    identical runs). A think time over one token interval makes every request's phase uniform,
    as with the Poisson arrivals of SGLang's and vLLM's serving benchmarks.
    """
    samples: list[Sample] = []
    completed = [0]
    t_start = time.perf_counter()
    t_measure, t_end = t_start + warmup_s, t_start + warmup_s + duration_s
    one, close = await open_target(target, tokens, keep_alive, client, request)

    async def run_client(i: int):
        await asyncio.sleep(i * stagger_s / concurrency)
        rng = random.Random(i)
        conn: list = []
        while True:
            if think_s:
                await asyncio.sleep(rng.random() * think_s)
            t0 = time.perf_counter()
            if t0 >= t_end:
                if conn:
                    conn[1].close()
                return
            s = await one(conn)
            completed[0] += 1
            if t0 >= t_measure and time.perf_counter() <= t_end:
                samples.append(s)

    try:
        await asyncio.gather(*(run_client(i) for i in range(concurrency)))
    finally:
        await close()
    if not samples:
        raise RuntimeError(f"no request to {target} finished inside the measuring window")
    return dict(summarize(samples, duration_s), completed=completed[0])


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


def summarize(samples: list[Sample], duration_s: float) -> dict:
    e2e = [s.e2e * 1000 for s in samples]
    ttft = [s.ttft * 1000 for s in samples]
    return {"requests": len(samples), "rps": len(samples) / duration_s, "e2e_p50_ms": statistics.median(e2e),
            "e2e_p99_ms": pct(e2e, 0.99), "ttft_p50_ms": statistics.median(ttft), "ttft_p99_ms": pct(ttft, 0.99)}
