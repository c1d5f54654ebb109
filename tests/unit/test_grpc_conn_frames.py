"""Frames a worker sends at chosen moments, against the router's lean gRPC client (router/grpc/conn.py):

- GOAWAY's last-stream-id: a call above it was never processed and fails at once with UNAVAILABLE
  (retryable elsewhere); a call at or below it goes on to its end; the connection closes after its
  last call.
- RST_STREAM REFUSED_STREAM (not processed): the call is sent again on a new stream.
- No SETTINGS at all (a frozen worker, a black-holed path): the connection attempt is given up.

A real grpc-core server cannot be made to send these between two given streams, so the peer here is
a few lines of HTTP/2 on a loopback socket (pure protocol logic; the real servers are in
tests/integration/test_grpc_client_policy.py)."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from hpack import Encoder

from proto.pdorch.v1 import worker_pb2
from router.dispatch.dispatch import GENERATE_PATH
from router.grpc.http2 import (
    ACK,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    PREFACE,
    REFUSED_STREAM,
    RST_STREAM,
    SETTINGS,
    frame,
)
from router.grpc.stream import Channel, RpcError


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
        writer.write(_answer(Encoder(), first))
        await writer.drain()
        while await reader.read(65536):  # until the client closes the connection
            pass
        self.closed.set()
        writer.close()


def _answer(enc: Encoder, stream_id: int) -> bytes:
    """One token and an OK status on `stream_id`."""
    msg = worker_pb2.GenerateResponse(request_id="a", token_ids=[1000], finish_reason="length").SerializeToString()
    return (frame(HEADERS, END_HEADERS, stream_id, enc.encode([(":status", "200"), ("content-type", "application/grpc")]))
            + frame(DATA, 0, stream_id, b"\x00" + len(msg).to_bytes(4, "big") + msg)
            + frame(HEADERS, END_HEADERS | END_STREAM, stream_id, enc.encode([("grpc-status", "0")])))


class _RefusingWorker:
    """Refuses the first `refusals` streams (RST_STREAM REFUSED_STREAM), answers the next."""

    def __init__(self, refusals: int):
        self.refusals = refusals
        self.stream_ids: list[int] = []
        self.requests: list[bytes] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(frame(SETTINGS, 0, 0))
        await reader.readexactly(len(PREFACE))
        enc = Encoder()
        while True:
            try:
                kind, flags, stream_id, payload = await _read_frame(reader)
            except asyncio.IncompleteReadError:
                break
            if kind == SETTINGS and not flags & ACK:
                writer.write(frame(SETTINGS, ACK, 0))
            elif kind == HEADERS:
                self.stream_ids.append(stream_id)
            elif kind == DATA:
                self.requests.append(payload)
                if len(self.stream_ids) <= self.refusals:
                    writer.write(frame(RST_STREAM, 0, stream_id, REFUSED_STREAM.to_bytes(4, "big")))
                else:
                    writer.write(_answer(enc, stream_id))
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


def test_a_refused_stream_is_sent_again_on_a_new_stream():
    async def main():
        worker = _RefusingWorker(refusals=2)
        server = await asyncio.start_server(worker.serve, "127.0.0.1", 0)
        channel = Channel(f"127.0.0.1:{server.sockets[0].getsockname()[1]}")
        try:
            call = await channel.call(GENERATE_PATH, _request("r"), worker_pb2.GenerateResponse.FromString, 10)
            got = await asyncio.wait_for(call.next_batch(), 10)
            return worker, got, await asyncio.wait_for(call.next_batch(), 10)
        finally:
            channel.close()
            server.close()
            await server.wait_closed()

    worker, got, end = asyncio.run(main())
    assert worker.stream_ids == [1, 3, 5]  # refused twice, answered on the third stream
    assert len(set(worker.requests)) == 1 and len(worker.requests) == 3  # the same request each time
    assert [m.token_ids[0] for m in got] == [1000] and end == []


def test_a_worker_that_never_sends_its_settings_fails_the_connection_attempt():
    async def main():
        accepted = []

        async def silent(reader, writer):
            accepted.append(writer)  # accepts the connection, never speaks HTTP/2

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        channel = Channel(f"127.0.0.1:{server.sockets[0].getsockname()[1]}", keepalive_s=0.2)
        try:
            with pytest.raises(RpcError) as err:
                await asyncio.wait_for(channel.call(GENERATE_PATH, _request("r"),
                                                    worker_pb2.GenerateResponse.FromString, 30), 10)
            return err.value, channel._connecting, len(accepted)
        finally:
            channel.close()
            for w in accepted:
                w.close()
            server.close()
            await server.wait_closed()

    error, connecting, accepted = asyncio.run(main())
    assert accepted == 1
    # Long before the call's own 30 s deadline, and the next call tries a new connection.
    assert error.code() == grpc.StatusCode.UNAVAILABLE and "no HTTP/2 SETTINGS within 0.2 s" in error.details()
    assert connecting is None
