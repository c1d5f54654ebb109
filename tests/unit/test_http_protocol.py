"""router/http/http_protocol.py + router/http/hot_path.py: the generation routes served by the protocol itself,
on raw sockets against the real router (keep-alive, pipelining, 100-continue, a body in pieces)."""

from __future__ import annotations

import gc
import json
import socket
import time

import httpx

from router.http.http_protocol import _address


def _post(path: str, body: dict, extra: bytes = b"", version: bytes = b"1.1") -> bytes:
    data = json.dumps(body).encode()
    return (b"POST %s HTTP/%s\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s"
            % (path.encode(), version, len(data), extra, data))


def _read_until(s: socket.socket, predicate, timeout_s: float = 10.0) -> bytes:
    s.settimeout(timeout_s)
    seen = b""
    while not predicate(seen):
        data = s.recv(65536)
        if not data:
            break
        seen += data
    return seen


_GEN = {"input_ids": [1, 2, 3], "stream": True, "sampling_params": {"max_new_tokens": 2}}
_END = b"data: [DONE]\n\n\r\n0\r\n\r\n"


def test_router_stream_starts_with_head_and_first_event_in_one_read(pd_router):
    """The first bytes the client can read hold the head AND an event."""
    r, _, _ = pd_router
    with socket.create_connection(("127.0.0.1", r.port), timeout=10) as s:
        s.sendall(_post("/generate", _GEN, b"Connection: close\r\n"))
        first = s.recv(65536)
    assert first.startswith(b"HTTP/1.1 200") and b"data: {" in first, first
    assert b"transfer-encoding: chunked\r\n" in first and b"connection: close\r\n" in first
    assert httpx.get(r.url + "/health").status_code == 200


def test_keep_alive_and_pipelining_mix_hot_and_asgi_requests(pd_router):
    """Three requests sent at once on one connection: a stream, a JSON answer, then /health through
    FastAPI; each is answered in order, whole, on the same connection."""
    r, _, _ = pd_router
    plain = dict(_GEN, stream=False)
    with socket.create_connection(("127.0.0.1", r.port), timeout=10) as s:
        s.sendall(_post("/generate", _GEN) + _post("/generate", plain) + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        seen = _read_until(s, lambda b: b.count(b"HTTP/1.1 200") == 3 and b.endswith(b"}"))
    first, second, third = seen.split(b"HTTP/1.1 200")[1:]
    assert first.endswith(_END), first
    assert b"application/json" in second and json.loads(second.split(b"\r\n\r\n", 1)[1])["meta_info"]
    assert json.loads(third.split(b"\r\n\r\n", 1)[1])["workers"]["prefill"]["routable"] == 1  # FastAPI's /health
    assert b"connection: close" not in seen.lower()


def test_expect_100_continue_and_a_body_in_pieces(pd_router):
    r, _, _ = pd_router
    data = json.dumps(_GEN).encode()
    with socket.create_connection(("127.0.0.1", r.port), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(data))
        assert _read_until(s, lambda b: b.endswith(b"\r\n\r\n")) == b"HTTP/1.1 100 Continue\r\n\r\n"
        s.sendall(data[:10])
        time.sleep(0.2)  # the rest arrives in a later read: the request waits for it
        s.sendall(data[10:])
        seen = _read_until(s, lambda b: b.endswith(b"0\r\n\r\n"))
    # /v1/completions wants a prompt, not input_ids: the whole body was read and judged
    assert seen.startswith(b"HTTP/1.1 400") and b'"param":"prompt"' in seen.replace(b" ", b""), seen


def test_http_1_0_gets_connection_close(pd_router):
    r, _, _ = pd_router
    with socket.create_connection(("127.0.0.1", r.port), timeout=10) as s:
        s.sendall(_post("/generate", dict(_GEN, stream=False), version=b"1.0"))
        seen = _read_until(s, lambda b: False)  # until the router closes the connection
    assert seen.startswith(b"HTTP/1.1 200") and b"connection: close\r\n" in seen


def test_a_lost_client_between_headers_and_body_costs_nothing(pd_router):
    r, _, d = pd_router
    before = len(d.behavior.calls)
    with socket.create_connection(("127.0.0.1", r.port), timeout=10) as s:
        s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        time.sleep(0.1)
    time.sleep(0.2)
    assert len(d.behavior.calls) == before and r.app.state.service.in_flight == 0
    assert httpx.post(r.url + "/generate", json=dict(_GEN, stream=False), timeout=10).status_code == 200


def test_served_requests_leave_nothing_in_reference_cycles(standins, make_router):
    """Streams of several events (a keep-alive armed after each), on connections closed after each
    answer and on one kept alive, and a client gone mid-stream: once they are over, none of the
    router's request objects waits for the garbage collector; reference counting freed them all.
    (Each connection used to leave its protocol, cycle, transport, writer, keep-alive and run in
    cycles: the collector's passes were ~7 % of the router's CPU under load.)"""
    p, d = standins("prefill"), standins("decode", token_delay_s=0.01)
    r = make_router([p.address], [d.address], policy="round_robin")
    body = dict(_GEN, sampling_params={"max_new_tokens": 4})
    httpx.post(r.url + "/generate", json=body, timeout=10)  # the first request's one-time objects
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", r.port), timeout=10) as s:
                s.sendall(_post("/generate", body, b"Connection: close\r\n"))
                assert _read_until(s, lambda b: b.endswith(_END)).endswith(_END)
                s.recv(1)  # the router closed the connection
        with socket.create_connection(("127.0.0.1", r.port), timeout=10) as s:
            for _ in range(3):
                s.sendall(_post("/generate", body))
                assert _read_until(s, lambda b: b.endswith(_END)).endswith(_END)
        with socket.create_connection(("127.0.0.1", r.port), timeout=10) as s:  # gone after the first event
            s.sendall(_post("/generate", dict(body, sampling_params={"max_new_tokens": 50})))
            _read_until(s, lambda b: b"data: {" in b)
        deadline = time.monotonic() + 10
        while r.app.state.service.in_flight and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # the protocols' connection_lost
        gc.collect()
        left = sorted({type(o).__qualname__ for o in gc.garbage if type(o).__module__.startswith("router.")})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert r.app.state.service.in_flight == 0
    assert left == [], f"request objects left in reference cycles: {left}"


def test_addresses_come_from_the_event_loop():
    assert _address(("127.0.0.1", 8000)) == ("127.0.0.1", 8000)
    assert _address(("::1", 8000, 0, 0)) == ("::1", 8000)
    assert _address("/tmp/router.sock") == ("/tmp/router.sock", None)
    assert _address(None) is None


def test_the_protocol_sets_every_attribute_uvicorns_own_sets():
    """RouterHttpProtocol.__init__ replaces uvicorn's (its logger lookups per connection): an upgrade of
    uvicorn that adds an attribute must fail here, not mid-request; the values it shares are the same."""
    import asyncio

    import uvicorn
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    from uvicorn.server import ServerState

    from router.http.app import RouterApp
    from router.http.http_protocol import RouterHttpProtocol

    config = uvicorn.Config(RouterApp(), http=RouterHttpProtocol, log_level="warning", access_log=False)
    loop = asyncio.new_event_loop()
    try:
        state = ServerState()
        theirs = HttpToolsProtocol(config, state, {}, loop)
        ours = RouterHttpProtocol(config, state, {}, loop)
    finally:
        loop.close()
    missing = set(vars(theirs)) - set(vars(ours))
    assert not missing, f"uvicorn's protocol sets {sorted(missing)}, RouterHttpProtocol.__init__ does not"
    for name in set(vars(theirs)) - {"parser", "pipeline"}:  # per-instance objects: a new one each
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.logger is theirs.logger and ours.access_logger is theirs.access_logger


def test_an_unusual_spelling_of_the_path_is_served_by_fastapi_with_the_same_handler(pd_router):
    """`/gen%65rate` is `/generate` after unquoting: FastAPI's route runs the same handler (and the
    same body limit), streaming through ASGI."""
    r, _, _ = pd_router
    with httpx.stream("POST", r.url + "/gen%65rate", json=_GEN, timeout=10) as resp:
        body = b"".join(resp.iter_bytes())
    assert resp.status_code == 200 and resp.headers["content-type"] == "text/event-stream"
    assert b"\"output_ids\":[1000,1001]" in body and body.endswith(b"data: [DONE]\n\n")
    too_large = httpx.post(r.url + "/gen%65rate", content=b"x" * (9 << 20), timeout=10)
    assert too_large.status_code == 413 and too_large.json()["error"]["code"] == "request_too_large"


def test_the_asgi_scope_is_the_one_uvicorn_makes_and_a_hot_request_makes_none():
    """RouterHttpProtocol.on_message_begin leaves the ASGI scope out (a hot route never reads it) and the
    ASGI path makes it with `asgi_scope`: it must equal uvicorn's own on_message_begin's, key for key."""
    import asyncio

    import uvicorn
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    from uvicorn.server import ServerState

    from router.http.app import RouterApp
    from router.http.http_protocol import RouterHttpProtocol

    config = uvicorn.Config(RouterApp(), http=RouterHttpProtocol, log_level="warning", access_log=False)
    loop = asyncio.new_event_loop()
    try:
        ours = RouterHttpProtocol(config, ServerState(), {"k": 1}, loop)
        ours.server, ours.client, ours.scheme = ("127.0.0.1", 8000), ("127.0.0.1", 5000), "http"
        ours.on_message_begin()
        assert ours.scope is None and ours.headers == [] and ours.url == b""
        HttpToolsProtocol.on_message_begin(ours)  # uvicorn's own, on the same protocol
        theirs = ours.scope
        ours.on_message_begin()
        assert ours.asgi_scope() == theirs
        assert ours.asgi_scope()["state"] is not ours.app_state  # a copy per request, as uvicorn's
    finally:
        loop.close()
