"""router/grpc/stream.py against real grpc.aio servers (the stand-in worker): same messages as
grpc.aio's client, flow control on large requests, status codes, deadlines, cancellation,
unreachable and restarted workers, many calls on one connection."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from pdorch.local_stack.processes import free_port
from pdorch.local_stack.router import wait_until
from pdorch.local_stack.standin import StandinServer
from proto.pdorch.v1 import worker_pb2, worker_pb2_grpc
from router.dispatch.dispatch import GENERATE_PATH
from router.grpc.stream import Channel, RpcError


def _request(rid: str = "r", tokens: int = 4, prompt: list[int] | None = None) -> bytes:
    return worker_pb2.GenerateRequest(request_id=rid, token_ids=prompt or [1, 2, 3], prefill_address="unused",
                                      sampling=worker_pb2.SamplingParams(max_tokens=tokens)).SerializeToString()


def _with_channel(address: str, body):
    """Run `await body(channel)` on a new event loop with a Channel to `address`, closed after."""
    async def main():
        channel = Channel(address)
        try:
            return await body(channel)
        finally:
            channel.close()

    return asyncio.run(main())


async def _collect(channel: Channel, request: bytes, timeout_s: float = 10.0) -> list:
    call = await channel.call(GENERATE_PATH, request, worker_pb2.GenerateResponse.FromString, timeout_s)
    out = []
    while batch := await call.next_batch():
        out.extend(batch)
    return out


def test_same_messages_as_grpc_aio(standins):
    d = standins("decode", cached_device=16)
    req = _request(tokens=5)

    async def main(channel):
        async with grpc.aio.insecure_channel(d.address) as ch:
            stub = worker_pb2_grpc.DecodeServiceStub(ch)
            expected = [m async for m in stub.Generate(worker_pb2.GenerateRequest.FromString(req), timeout=10)]
        return expected, await _collect(channel, req)

    expected, got = _with_channel(d.address, main)
    assert len(got) == 5 and got == expected
    assert got[-1].finish_reason == "length" and got[0].cached.device == 16


def test_request_larger_than_the_flow_control_window_arrives_whole(standins):
    d = standins("decode")
    prompt = list(range(1, 300_001))  # ~1 MB serialized: 15x the 64 KiB initial HTTP/2 window

    async def main(channel):
        return await _collect(channel, _request(prompt=prompt, tokens=2))

    got = _with_channel(d.address, main)
    assert [m.prompt_tokens for m in got] == [300_000, 300_000]
    assert list(d.behavior.calls[-1].token_ids) == prompt


def test_worker_error_status_and_message(standins):
    d = standins("decode", fail_before_first=1, fail_code=grpc.StatusCode.INVALID_ARGUMENT)

    async def main(channel):
        with pytest.raises(RpcError) as err:
            await _collect(channel, _request())
        return err.value, await _collect(channel, _request())  # the connection stays usable

    error, after = _with_channel(d.address, main)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "stand-in decode: injected failure"
    assert len(after) == 4


def test_deadline_is_enforced_here_and_reaches_the_worker(standins):
    d = standins("decode", first_token_delay_s=5.0)

    async def main(channel):
        t0 = time.monotonic()
        with pytest.raises(RpcError) as err:
            await _collect(channel, _request("slow"), timeout_s=0.3)
        return err.value, time.monotonic() - t0

    error, elapsed = _with_channel(d.address, main)
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert elapsed < 2.0
    wait_until(lambda: "slow" in d.behavior.cancelled, 3, "the worker to see the call end at its deadline")


def test_cancel_stops_the_call_on_the_worker(standins):
    d = standins("decode", token_delay_s=0.1)

    async def main(channel):
        call = await channel.call(GENERATE_PATH, _request("gone", tokens=100),
                                  worker_pb2.GenerateResponse.FromString, 10)
        first = await call.next_batch()
        call.cancel()
        with pytest.raises(RpcError) as err:
            await call.next_batch()
        await asyncio.get_running_loop().run_in_executor(
            None, wait_until, lambda: "gone" in d.behavior.cancelled, 3, "the worker to see the cancel")
        d.behavior.token_delay_s = 0.0
        return first, err.value, await _collect(channel, _request("next"))

    first, error, after = _with_channel(d.address, main)
    assert first[0].token_ids == [1000]
    assert error.code() == grpc.StatusCode.CANCELLED
    assert len(after) == 4


def test_unreachable_worker_is_unavailable_at_once():
    async def main(channel):
        t0 = time.monotonic()
        with pytest.raises(RpcError) as err:
            await _collect(channel, _request())
        return err.value, time.monotonic() - t0

    error, elapsed = _with_channel(f"127.0.0.1:{free_port()}", main)
    assert error.code() == grpc.StatusCode.UNAVAILABLE and "failed to connect" in error.details()
    assert elapsed < 2.0


def test_worker_stopping_mid_stream_fails_the_call_and_a_restarted_worker_is_reached_again():
    port = free_port()
    first = StandinServer("decode", port).start()
    first.behavior.token_delay_s = 0.2

    async def main(channel):
        loop = asyncio.get_running_loop()
        call = await channel.call(GENERATE_PATH, _request("cut", tokens=100),
                                  worker_pb2.GenerateResponse.FromString, 10)
        await call.next_batch()
        await loop.run_in_executor(None, first.stop)
        t0 = time.monotonic()
        with pytest.raises(RpcError) as err:
            while await call.next_batch():
                pass
        failed_after = time.monotonic() - t0
        second = await loop.run_in_executor(None, StandinServer("decode", port).start)
        try:
            return err.value, failed_after, await _collect(channel, _request("again"))
        finally:
            await loop.run_in_executor(None, second.stop)

    error, failed_after, after = _with_channel(f"127.0.0.1:{port}", main)
    assert error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), error
    assert failed_after < 2.0
    assert len(after) == 4


def test_many_concurrent_calls_share_one_connection(standins):
    d = standins("decode", token_delay_s=0.01)

    async def main(channel):
        results = await asyncio.gather(*(_collect(channel, _request(f"r{i}", tokens=1 + i % 7))
                                         for i in range(200)))
        return results, channel._conn.next_stream_id

    results, next_stream_id = _with_channel(d.address, main)
    for i, msgs in enumerate(results):
        assert [m.token_ids[0] for m in msgs] == list(range(1000, 1001 + i % 7))
        assert {m.request_id for m in msgs} == {f"r{i}"}
    assert next_stream_id == 1 + 2 * 200  # one connection carried all 200 calls
