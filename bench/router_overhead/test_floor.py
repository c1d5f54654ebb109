"""bench/router_overhead/floor.py, the control of the router-overhead comparison: against a real
stand-in decode worker it answers /generate with the same stream as the router (an event per batch
of tokens, the body ended with [DONE]), so its CPU per request is a fair floor."""

from __future__ import annotations

import asyncio
import json
from itertools import pairwise

from bench.router_overhead.floor import FloorProtocol
from pdorch.local_stack.standin import Behavior, StandinServer
from pdorch.ports import free_port
from router.grpc.stream import Channel


def _events(raw: bytes) -> list[bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head
    data = b""
    while True:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        data, body = data + body[:size], body[size + 2:]
    return [e for e in data.split(b"\n\n") if e]


def test_the_floor_streams_what_the_router_streams():
    standin = StandinServer("decode", free_port(), Behavior(token_delay_s=0.02)).start()
    try:
        async def scenario():
            channel, tasks = Channel(standin.address), set()
            server = await asyncio.get_running_loop().create_server(
                lambda: FloorProtocol(channel, tasks), "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            body = json.dumps({"input_ids": list(range(40)), "stream": True,
                               "sampling_params": {"max_new_tokens": 4}}).encode()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                         % (len(body), body))
            raw = await asyncio.wait_for(reader.read(-1), 10)  # the floor closes after the stream
            writer.close()
            server.close()
            channel.close()
            return raw

        events = _events(asyncio.run(scenario()))
        assert events[-1] == b"data: [DONE]"
        chunks = [json.loads(e[len(b"data: "):]) for e in events[:-1]]
        # NOTE: tokens that arrive together are one event, as in the router
        ids = [c["output_ids"] for c in chunks]
        assert ids[-1] == [1000, 1001, 1002, 1003] and all(a == b[:len(a)] and a != b for a, b in pairwise(ids))
        assert len(chunks) >= 2  # 20 ms between tokens: not all in one event
        assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
        assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    finally:
        standin.stop()
