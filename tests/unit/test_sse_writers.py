"""The one loop that writes a stream (`SSEResponse.write_to`, router/http/sse.py) with the hot path's
chunked writer (`ChunkedSSE`, router/http/hot_path.py) on a recording transport: the head goes with
the first event, the terminator with the last, a paused transport is waited for before the write,
the events are closed however the stream ends. The ASGI writer is checked in test_responses_events.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from router.http.hot_path import ChunkedSSE
from router.http.sse import SSEResponse

HEAD = b"HTTP/1.1 200 OK\r\n\r\n"


class Transport:
    def __init__(self):
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return False


class Flow:
    def __init__(self, paused: bool):
        self.write_paused = paused
        self.drained = asyncio.Event()

    async def drain(self) -> None:
        await self.drained.wait()
        self.write_paused = False


def _cycle(transport: Transport, flow: Flow) -> SimpleNamespace:
    return SimpleNamespace(transport=transport, flow=flow, _head=lambda status, headers: [HEAD])


def _response(chunks: list[bytes], closed: list[str]) -> SSEResponse:
    async def events():
        try:
            for c in chunks:
                yield c
        finally:
            closed.append("events")

    async def finalize():
        closed.append("finalize")

    return SSEResponse(events(), finalize)


def test_head_with_the_first_event_terminator_with_the_last_then_closed():
    transport, closed = Transport(), []
    response = _response([b"data: a\n\n", b"data: [DONE]\n\n", b"data: never\n\n"], closed)
    asyncio.run(response.write_to(ChunkedSSE(_cycle(transport, Flow(False)), response)))
    assert transport.writes == [HEAD + b"9\r\ndata: a\n\n\r\n", b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"]
    assert closed == ["events", "finalize"]


def test_events_that_end_without_a_last_one_end_the_body_and_none_at_all_send_the_head():
    for chunks, writes in (([b"data: a\n\n"], [HEAD + b"9\r\ndata: a\n\n\r\n", b"0\r\n\r\n"]),
                           ([], [HEAD + b"0\r\n\r\n"])):
        transport, closed = Transport(), []
        response = _response(chunks, closed)
        asyncio.run(response.write_to(ChunkedSSE(_cycle(transport, Flow(False)), response)))
        assert transport.writes == writes and closed == ["events", "finalize"]


def test_a_paused_transport_is_waited_for_before_the_write():
    async def main():
        transport, flow, closed = Transport(), Flow(True), []
        response = _response([b"data: a\n\n", b"data: [DONE]\n\n"], closed)
        writing = asyncio.create_task(response.write_to(ChunkedSSE(_cycle(transport, flow), response)))
        await asyncio.sleep(0.05)
        assert transport.writes == [] and not writing.done()  # nothing written while paused
        flow.drained.set()
        await asyncio.wait_for(writing, 5)
        assert transport.writes[0].startswith(HEAD + b"9\r\n") and transport.writes[-1].endswith(b"0\r\n\r\n")

    asyncio.run(main())


def test_no_keepalive_after_the_stream_is_over():
    async def main():
        transport, comments = Transport(), []

        def count() -> int:
            return sum(1 for w in transport.writes if b": keep-alive" in w)

        async def events():  # an event, then the stream errs while it waits for the next
            yield b"data: a\n\n"
            await asyncio.sleep(0.15)
            raise RuntimeError("the worker went away")

        async def finalize():  # closing takes a while: no comment may go out meanwhile
            comments.append(count())
            await asyncio.sleep(0.3)
            comments.append(count())

        response = SSEResponse(events(), finalize, keepalive_s=0.05)
        try:
            await response.write_to(ChunkedSSE(_cycle(transport, Flow(False)), response))
        except RuntimeError:
            pass
        await asyncio.sleep(0.1)
        assert comments[0] >= 1, transport.writes  # while it waited for the next event
        assert comments[1] == comments[0] == count(), transport.writes

    asyncio.run(main())
