"""router/http_protocol.py: an SSE response head leaves together with the first event."""

from __future__ import annotations

import socket

import httpx

from router.http_protocol import _HeadHoldingTransport

SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


class _Recorder:
    """Stands in for the asyncio transport: records writes."""

    def __init__(self):
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(name, f"info:{name}")


def test_sse_head_is_written_with_the_first_event():
    t = _Recorder()
    h = _HeadHoldingTransport(t)
    h.write(SSE_HEAD)
    assert t.writes == []
    h.write(b"5\r\ndata:\r\n")
    h.write(b"0\r\n\r\n")
    assert t.writes == [SSE_HEAD + b"5\r\ndata:\r\n", b"0\r\n\r\n"]


def test_other_responses_pass_through_and_close_flushes_a_held_head():
    t = _Recorder()
    h = _HeadHoldingTransport(t)
    json_head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n"
    h.write(json_head)
    assert t.writes == [json_head]
    h.write(SSE_HEAD)
    h.close()
    assert t.writes == [json_head, SSE_HEAD] and t.closed
    assert h.get_extra_info("sslcontext") == "info:sslcontext"


def test_uvicorn_reads_the_addresses_the_loop_holds():
    """uvicorn's address look-ups get the transport's own peername/sockname, not a socket's syscalls."""
    from uvicorn.protocols.utils import get_local_addr, get_remote_addr

    h = _HeadHoldingTransport(_Recorder())
    assert get_remote_addr(h) == ("127.0.0.1", 50000)
    assert get_local_addr(h) == ("127.0.0.1", 8000)


def test_router_stream_starts_with_head_and_first_event_in_one_read(pd_router):
    """Through the real router: the first bytes the client can read hold the head AND an event."""
    r, _, _ = pd_router
    body = b'{"input_ids": [1, 2, 3], "stream": true, "sampling_params": {"max_new_tokens": 2}}'
    with socket.create_connection(("127.0.0.1", r.port), timeout=10) as s:
        s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        first = s.recv(65536)
    assert first.startswith(b"HTTP/1.1 200") and b"data: {" in first, first
    assert httpx.get(r.url + "/health").status_code == 200
