"""uvicorn's httptools protocol, with a stream's response head sent together with its first event.

uvicorn writes the status line and headers at `http.response.start` and every body message at
once, so a streamed response costs the router two `write` syscalls (and the client two wake-ups)
before the first token arrives. The router starts an SSE response only when the first token is
already there (router/generation.py), so holding the head until the first body bytes costs no
time and saves one syscall on the TTFT path of every streamed request.

It also answers uvicorn's per-connection address look-ups from what the event loop already knows:
uvicorn asks for the "socket" and calls its getpeername()/getsockname(), which with uvloop is a
new socket-like object per ask and five getsockname/getpeername syscalls per connection (and the
router sees one connection per request from clients that do not keep them); uvloop has read both
addresses once at accept time.

    uvicorn.Config(app, http=RouterHttpProtocol)
"""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class _LoopAddresses:
    """What uvicorn calls on the transport's "socket": the addresses the event loop holds."""

    __slots__ = ("_transport",)

    def __init__(self, transport):
        self._transport = transport

    def getpeername(self):
        return self._transport.get_extra_info("peername")

    def getsockname(self):
        return self._transport.get_extra_info("sockname")


class _HeadHoldingTransport:
    """Passes everything to the real transport, except that a `text/event-stream` response head is
    held and prepended to the next write (or written before closing)."""

    def __init__(self, transport):
        self._transport = transport
        self._held = b""

    def write(self, data: bytes) -> None:
        if self._held:
            data, self._held = self._held + data, b""
        elif data.startswith(b"HTTP/1.1 200") and b"content-type: text/event-stream\r\n" in data:
            self._held = data
            return
        self._transport.write(data)

    def close(self) -> None:
        if self._held:
            self._transport.write(self._held)
            self._held = b""
        self._transport.close()

    def get_extra_info(self, name, default=None):
        if name == "socket" and self._transport.get_extra_info("peername") is not None:
            return _LoopAddresses(self._transport)
        return self._transport.get_extra_info(name, default)

    def __getattr__(self, name):
        return getattr(self._transport, name)


class RouterHttpProtocol(HttpToolsProtocol):
    def connection_made(self, transport) -> None:
        super().connection_made(_HeadHoldingTransport(transport))
