"""GOAWAY's last-stream-id in the router's lean gRPC client (router/grpc_conn.py): a call above it was
never processed and fails at once with UNAVAILABLE (retryable elsewhere); a call at or below it goes
on to its end; the connection closes after its last call.

A real grpc-core server cannot be made to send a GOAWAY between two given streams, so the peer here
is a few lines of HTTP/2 on a loopback socket (pure protocol logic; the real servers are in
tests/integration/test_grpc_client_policy.py)."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from hpack import Encoder

from proto.pdorch.v1 import worker_pb2
from router.dispatch import GENERATE_PATH
from router.grpc_stream import Channel, RpcError
from router.http2 import ACK, DATA, END_HEADERS, END_STREAM, GOAWAY, HEADERS, PREFACE, SETTINGS, frame


async def _read_frame(reader: asyncio.StreamReader) -> tuple[int, int, int, bytes]:
    head = await reader.readexactly(9)
    length = int.from_bytes(head[:3], "big")
    payload = await reader.readexactly(length)
    return head[3], head[4], int.from_bytes(head[5:9], "big") & 0x7FFFFFFF, payload


class _DrainingWorker:
    """Accepts two calls, sends GOAWAY naming the first as the last it processes, answers it."""

    def __init__(self):
        self.closed = asyncio.Event()
        self.stream_ids: list[int] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(frame(SETTINGS, 0, 0))
        assert await reader.readexactly(len(PREFACE)) == PREFACE
        while len(self.stream_ids) < 2:
            kind, flags, stream_id, _ = await _read_frame(reader)
            if kind == SETTINGS and not flags & ACK:
                writer.write(frame(SETTINGS, ACK, 0))
            elif kind == HEADERS:
                self.stream_ids.append(stream_id)
        first = self.stream_ids[0]
        writer.write(frame(GOAWAY, 0, 0, first.to_bytes(4, "big") + (0).to_bytes(4, "big") + b"draining"))
        enc = Encoder()
        msg = worker_pb2.GenerateResponse(request_id="a", token_ids=[1000], finish_reason="length").SerializeToString()
        writer.write(frame(HEADERS, END_HEADERS, first, enc.encode([(":status", "200"),
                                                                    ("content-type", "application/grpc")]))
                     + frame(DATA, 0, first, b"\x00" + len(msg).to_bytes(4, "big") + msg)
                     + frame(HEADERS, END_HEADERS | END_STREAM, first, enc.encode([("grpc-status", "0")])))
        await writer.drain()
        while await reader.read(65536):  # until the client closes the connection
            pass
        self.closed.set()
        writer.close()


def _request(rid: str) -> bytes:
    return worker_pb2.GenerateRequest(request_id=rid, token_ids=[1, 2, 3]).SerializeToString()


def test_goaway_fails_calls_above_its_last_stream_id_and_lets_the_others_finish():
    async def main():
        worker = _DrainingWorker()
        server = await asyncio.start_server(worker.serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        channel = Channel(f"127.0.0.1:{port}")
        try:
            a = await channel.call(GENERATE_PATH, _request("a"), worker_pb2.GenerateResponse.FromString, 10)
            b = await channel.call(GENERATE_PATH, _request("b"), worker_pb2.GenerateResponse.FromString, 10)
            with pytest.raises(RpcError) as err:
                await asyncio.wait_for(b.next_batch(), 10)
            got = await asyncio.wait_for(a.next_batch(), 10)
            end = await asyncio.wait_for(a.next_batch(), 10)
            await asyncio.wait_for(worker.closed.wait(), 10)  # closed after its last call
            return worker.stream_ids, err.value, got, end, channel._conn
        finally:
            channel.close()
            server.close()
            await server.wait_closed()

    stream_ids, error, got, end, conn = asyncio.run(main())
    assert stream_ids == [1, 3]
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert "not processed" in error.details() and "GOAWAY NO_ERROR: draining" in error.details()
    assert [m.token_ids[0] for m in got] == [1000] and end == []
    assert conn.goaway == (0, 1, b"draining") and not conn.usable
