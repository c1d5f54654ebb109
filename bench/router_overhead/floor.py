"""The least a Python router can do per request: the control of the router-overhead comparison.

A bare HTTP -> gRPC streaming proxy on the same event loop (uvloop), the same gRPC client
(router/grpc) and the same SSE body (router/http/formats.py) as the pdorch router, and nothing else:
no routing, no index, no metrics, no failover, no body validation, no limits, one decode worker.
Per request: parse the HTTP head and the JSON body, open Generate, write each batch of tokens as
one chunked SSE event as it arrives. Whatever this costs per request, any Python router with the
same loop, client and wire format costs at least as much; comparing it with sglang-router in the
same run says whether "CPU per request <= sglang-router's" is within reach of Python on this machine.

Not a product: it answers only well-formed `POST /generate` from load_client.py.

    python -m bench.router_overhead.floor --port 8100 --decode 127.0.0.1:50171
"""

from __future__ import annotations

import argparse
import asyncio
import time

import orjson
import uvloop

from proto.pdorch.v1 import worker_pb2
from router.dispatch.dispatch import GENERATE_PATH
from router.grpc.stream import Channel
from router.http import formats
from router.http.sse import SSE_HEADERS

# The router's stream head (router/http/hot_path.py writes the same headers), so both write the same bytes.
HEAD = b"HTTP/1.1 200 OK\r\n" + b"".join(b"%s: %s\r\n" % kv for kv in (*SSE_HEADERS, (b"transfer-encoding", b"chunked")))


class FloorProtocol(asyncio.Protocol):
    def __init__(self, channel: Channel, tasks: set):
        self.channel = channel
        self.tasks = tasks
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buffer[:end].lower()
        start = head.find(b"content-length:") + len(b"content-length:")
        length = int(head[start:head.find(b"\r\n", start)])
        if len(self.buffer) < end + 4 + length:
            return
        body, self.buffer = self.buffer[end + 4:end + 4 + length], b""
        close = b"connection: close" in head
        task = asyncio.get_running_loop().create_task(self.serve(orjson.loads(body), close))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def serve(self, body: dict, close: bool) -> None:
        t0 = time.perf_counter()
        ids = body["input_ids"]
        max_tokens = body["sampling_params"]["max_new_tokens"]
        req = worker_pb2.GenerateRequest(request_id="floor", token_ids=ids, prefill_address="unused",
                                         sampling=worker_pb2.SamplingParams(max_tokens=max_tokens))
        call = await self.channel.call(GENERATE_PATH, req.SerializeToString(),
                                       worker_pb2.GenerateResponse.FromString, 60)
        progress = formats.Progress("floor", len(ids))
        head = HEAD + (b"connection: close\r\n\r\n" if close else b"\r\n")
        while batch := await call.next_batch():
            for msg in batch:
                progress.add(msg)
            event = formats.sse(formats.generate_body(progress, time.perf_counter() - t0))
            if progress.finish_reason:  # as the router does: the last event ends the body in one write
                event += formats.DONE
                self.transport.write(b"%s%x\r\n%s\r\n0\r\n\r\n" % (head, len(event), event))
                break
            self.transport.write(b"%s%x\r\n%s\r\n" % (head, len(event), event))
            head = b""
        if close:
            self.transport.close()


async def serve(port: int, decode: str) -> None:
    channel, tasks = Channel(decode), set()
    server = await asyncio.get_running_loop().create_server(lambda: FloorProtocol(channel, tasks), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--decode", required=True, help="host:port of a decode worker (or pdorch/local_stack/standin.py)")
    args = ap.parse_args()
    uvloop.run(serve(args.port, args.decode))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
