"""The router's lean gRPC client (router/grpc/stream.py) against real grpc-core servers over time
(issue 14, hazard 4): idle connections, silent streams, the server's ping policy, its
MAX_CONCURRENT_STREAMS, GOAWAY and message sizes. Each case ends in a served call or a clear error,
never a hang or a stream dropped without one.

The peer is a real grpc.aio server (DecodeService.Generate with controllable timing) run with the
workers' own server options (pdorch/worker/main.py). Keepalive is time-scaled: grpc-core's ping
enforcement compares intervals between pings with its minimum interval and counts strikes, so
dividing the client's keepalive interval and the server's minimum interval by the same factor
keeps the outcome and makes minutes into seconds.
"""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
import pytest

from pdorch.local_stack.processes import free_port
from pdorch.worker import main as worker_main
from proto.pdorch.v1 import worker_pb2, worker_pb2_grpc
from router.dispatch.dispatch import GENERATE_PATH
from router.grpc import stream as grpc_stream
from router.grpc.stream import Channel, RpcError

SCALE = 0.05  # 1/20: the router's 10 s keepalive becomes 0.5 s
CLIENT_KEEPALIVE_S = grpc_stream.KEEPALIVE_S * SCALE
_GRPC_DEFAULT_MIN_PING_MS = 300_000  # grpc-core's server default (5 minutes) when a worker sets none


def scaled_worker_options(**overrides) -> list[tuple[str, int]]:
    """The workers' server options with the minimum interval they permit between pings scaled by SCALE
    (their own keepalive pings stay as they are: they do not fire within a test)."""
    opts = dict(worker_main.GRPC_OPTIONS)
    opts["grpc.http2.min_ping_interval_without_data_ms"] = max(1, int(
        opts.get("grpc.http2.min_ping_interval_without_data_ms", _GRPC_DEFAULT_MIN_PING_MS) * SCALE))
    opts.pop("grpc.so_reuseport", None)
    opts.update(overrides)
    return list(opts.items())


class _Decode(worker_pb2_grpc.DecodeServiceServicer):
    def __init__(self):
        self.first_token_delay_s = 0.0
        self.token_delay_s = 0.0
        self.text_bytes = 0  # each message's text is this long (0: " w{i}")
        self.active = 0
        self.max_active = 0
        self.calls = 0

    async def Generate(self, request, context):
        self.calls += 1
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            await asyncio.sleep(self.first_token_delay_s)
            n = max(1, request.sampling.max_tokens)
            for i in range(n):
                if i and self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
                yield worker_pb2.GenerateResponse(
                    request_id=request.request_id, token_ids=[1000 + i],
                    text="x" * self.text_bytes if self.text_bytes else f" w{i}",
                    finish_reason="length" if i == n - 1 else "")
        finally:
            self.active -= 1


class Peer:
    """A real grpc.aio server on its own event-loop thread."""

    def __init__(self, options):
        self.options = options
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.decode = _Decode()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=f"grpc-peer-{self.port}", daemon=True)
        self.server: grpc.aio.Server | None = None

    def _run(self, coro, timeout_s: float = 10.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def start(self) -> Peer:
        self.thread.start()

        async def start():
            self.server = grpc.aio.server(options=self.options)
            worker_pb2_grpc.add_DecodeServiceServicer_to_server(self.decode, self.server)
            assert self.server.add_insecure_port(self.address) == self.port
            await self.server.start()

        self._run(start())
        return self

    def stop_soon(self, grace: float | None):
        """Begin a server stop (GOAWAY, then calls end after `grace`); returns the stop's future."""
        return asyncio.run_coroutine_threadsafe(self.server.stop(grace), self.loop)

    def close(self) -> None:
        if self.server is not None:
            self._run(self.server.stop(None))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        assert not self.thread.is_alive()
        self.loop.close()


@pytest.fixture
def peer():
    started: list[Peer] = []

    def make(options) -> Peer:
        p = Peer(options).start()
        started.append(p)
        return p

    yield make
    for p in started:
        p.close()


def _request(rid: str, tokens: int = 3) -> bytes:
    return worker_pb2.GenerateRequest(request_id=rid, token_ids=[1, 2, 3], prefill_address="unused",
                                      sampling=worker_pb2.SamplingParams(max_tokens=tokens)).SerializeToString()


async def _collect(channel: Channel, rid: str, tokens: int = 3, timeout_s: float = 20.0) -> list:
    call = await channel.call(GENERATE_PATH, _request(rid, tokens), worker_pb2.GenerateResponse.FromString, timeout_s)
    out = []
    while batch := await call.next_batch():
        out.extend(batch)
    return out


def _run(address: str, body, **channel_kw):
    async def main():
        channel = Channel(address, **channel_kw)
        try:
            return await asyncio.wait_for(body(channel), 30)  # NOTE: a hang fails the test, never blocks it
        finally:
            channel.close()

    return asyncio.run(main())


def _tokens(msgs) -> list[int]:
    return [t for m in msgs for t in m.token_ids]


# ---------------------------------------------------------------------------------------- keepalive
def test_an_idle_connection_sends_no_pings_and_serves_the_next_request(peer):
    # The strictest grpc-core policy: with no call open every ping is "too soon" (the 2-hour rule)
    # and the first strike ends the connection. An idle connection must stay silent.
    p = peer(scaled_worker_options(**{"grpc.keepalive_permit_without_calls": 0, "grpc.http2.max_ping_strikes": 1}))

    async def body(channel):
        first = await _collect(channel, "before-idle")
        conn = channel._conn
        await asyncio.sleep(20 * keepalive_s)  # "minutes" idle: 20 keepalive intervals
        after = await _collect(channel, "after-idle")
        return first, after, conn, channel._conn

    keepalive_s = 0.1
    first, after, conn_before, conn_after = _run(p.address, body, keepalive_s=keepalive_s)
    assert _tokens(first) == _tokens(after) == [1000, 1001, 1002]
    assert conn_after is conn_before and conn_before.goaway is None
    assert conn_before.pings_sent == 0


def test_a_connection_the_server_closed_while_idle_is_replaced_for_the_next_request(peer):
    p = peer(scaled_worker_options(**{"grpc.max_connection_idle_ms": 300}))

    async def body(channel):
        await _collect(channel, "before-idle")
        conn = channel._conn
        deadline = time.monotonic() + 10
        while conn.goaway is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return conn, await _collect(channel, "after-idle"), channel._conn

    old, after, new = _run(p.address, body, keepalive_s=CLIENT_KEEPALIVE_S)
    assert old.goaway is not None and b"idle" in old.goaway[2]  # grpc-core retired it: "connection idle"
    assert new is not old and _tokens(after) == [1000, 1001, 1002]


def test_a_stream_silent_for_longer_than_the_ping_window_is_served(peer):
    # A long prefill: nothing arrives on the stream for many keepalive intervals, so the client
    # pings; the worker's real ping policy must accept every one of them.
    p = peer(scaled_worker_options())
    p.decode.first_token_delay_s = 8 * CLIENT_KEEPALIVE_S

    async def body(channel):
        msgs = await _collect(channel, "long-prefill")
        return msgs, channel._conn

    msgs, conn = _run(p.address, body, keepalive_s=CLIENT_KEEPALIVE_S)
    assert _tokens(msgs) == [1000, 1001, 1002]
    assert conn.goaway is None
    assert conn.pings_sent >= 4  # the silence was covered by keepalive pings, all accepted


def test_a_client_pinging_too_often_gets_a_clear_error_and_backs_off(peer):
    # A worker with a stricter policy than ours (pings at most every 2 s here, 40 s unscaled): grpc-core answers
    # GOAWAY ENHANCE_YOUR_CALM "too_many_pings" and closes the connection.
    p = peer(scaled_worker_options(**{"grpc.http2.min_ping_interval_without_data_ms": 2000}))
    p.decode.first_token_delay_s = 10 * CLIENT_KEEPALIVE_S

    async def body(channel):
        with pytest.raises(RpcError) as err:
            await _collect(channel, "silent")
        p.decode.first_token_delay_s = 0.0
        return err.value, channel.keepalive_s, await _collect(channel, "next")

    error, keepalive_after, after = _run(p.address, body, keepalive_s=CLIENT_KEEPALIVE_S)
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert "too_many_pings" in error.details() and "ENHANCE_YOUR_CALM" in error.details()
    assert keepalive_after == 2 * CLIENT_KEEPALIVE_S  # like grpc-core's client: ping half as often
    assert _tokens(after) == [1000, 1001, 1002]


# ------------------------------------------------------------------------------ concurrency, GOAWAY
def test_more_concurrent_calls_than_the_server_allows_wait_for_a_stream(peer):
    p = peer(scaled_worker_options(**{"grpc.max_concurrent_streams": 2}))
    p.decode.token_delay_s = 0.05

    async def body(channel):
        return await asyncio.gather(*(_collect(channel, f"r{i}", tokens=4) for i in range(8)))

    results = _run(p.address, body, keepalive_s=CLIENT_KEEPALIVE_S)
    assert [_tokens(r) for r in results] == [[1000, 1001, 1002, 1003]] * 8
    assert p.decode.calls == 8 and p.decode.max_active <= 2


def test_goaway_mid_stream_lets_the_open_stream_finish_and_new_calls_fail_clearly(peer):
    p = peer(scaled_worker_options())
    p.decode.token_delay_s = 0.1

    async def body(channel):
        loop = asyncio.get_running_loop()
        call = await channel.call(GENERATE_PATH, _request("draining", tokens=10),
                                  worker_pb2.GenerateResponse.FromString, 20)
        got = await call.next_batch()
        stopping = p.stop_soon(grace=10.0)  # GOAWAY; open calls have 10 s to finish
        conn = channel._conn
        while conn.goaway is None:
            await asyncio.sleep(0.01)
        with pytest.raises(RpcError) as err:  # never sent on the going-away connection
            await _collect(channel, "too-late")
        while batch := await call.next_batch():
            got.extend(batch)
        await loop.run_in_executor(None, stopping.result, 15)
        return got, err.value, conn

    got, error, conn = _run(p.address, body, keepalive_s=CLIENT_KEEPALIVE_S)
    assert _tokens(got) == list(range(1000, 1010))  # served whole
    assert conn.goaway[0] == 0 and conn.goaway[1] >= 1  # NO_ERROR, the open stream below last-stream-id
    assert error.code() == grpc.StatusCode.UNAVAILABLE and "failed to connect" in error.details()


def test_a_stream_outliving_the_shutdown_grace_fails_with_a_clear_error(peer):
    p = peer(scaled_worker_options())
    p.decode.token_delay_s = 0.2

    async def body(channel):
        call = await channel.call(GENERATE_PATH, _request("cut", tokens=100),
                                  worker_pb2.GenerateResponse.FromString, 20)
        await call.next_batch()
        p.stop_soon(grace=0.3)
        t0 = time.monotonic()
        with pytest.raises(RpcError) as err:
            while await call.next_batch():
                pass
        return err.value, time.monotonic() - t0

    error, waited = _run(p.address, body, keepalive_s=CLIENT_KEEPALIVE_S)
    assert error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), error
    assert waited < 10  # ended by the server's grace, not by the call's 20 s deadline


# ---------------------------------------------------------------------------------- message size
def test_a_message_larger_than_the_cap_is_refused_with_a_clear_error(peer):
    p = peer(scaled_worker_options())
    p.decode.text_bytes = 2 << 20

    async def body(channel):
        with pytest.raises(RpcError) as err:
            await _collect(channel, "huge", tokens=1)
        p.decode.text_bytes = 0
        return err.value, await _collect(channel, "small")

    error, after = _run(p.address, body, keepalive_s=CLIENT_KEEPALIVE_S, max_message_bytes=1 << 20)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "larger than" in error.details() and str(1 << 20) in error.details()
    assert _tokens(after) == [1000, 1001, 1002]  # the connection stays usable
