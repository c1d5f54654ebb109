"""uvicorn's httptools protocol, serving the generation routes itself (router/http/hot_path.py).

    uvicorn.Config(app, http=RouterHttpProtocol)     app: RouterApp, whose `hot_routes` it serves

A POST to a path in `app.hot_routes.handlers` becomes a `HotCycle` when its headers are parsed;
everything else (other routes, other methods, an upgrade, `limit_concurrency`, the metrics port)
takes uvicorn's ASGI cycle to FastAPI, unchanged. The path is matched as sent: a percent-encoded
or otherwise unusual spelling of a generation route takes the ASGI path, where FastAPI serves the
same handler.

It also takes the connection's addresses from what the event loop already knows: uvicorn asks
the transport for its "socket" and calls getsockname()/getpeername() on it, which with uvloop is
a new socket-like object per ask and five syscalls per connection (and the router sees one
connection per request from clients that do not keep them); uvloop read both at accept time.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

import httptools
from uvicorn.config import Config
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.utils import is_ssl
from uvicorn.server import ServerState

from router.http.hot_path import HotCycle, HotRoutes


def _address(info) -> tuple | None:
    if isinstance(info, (tuple, list)) and len(info) >= 2:
        return (str(info[0]), int(info[1]))
    if isinstance(info, str):
        return (info, None)
    return None


# uvicorn's protocol looks its two loggers up by name for every connection (the logging module's lock
# each time); they are the same objects for the life of the process.
_ERROR_LOG = logging.getLogger("uvicorn.error")
_ACCESS_LOG = logging.getLogger("uvicorn.access")


class RouterHttpProtocol(HttpToolsProtocol):
    def __init__(self, config: Config, server_state: ServerState, app_state: dict, _loop=None) -> None:
        # NOTE: HttpToolsProtocol.__init__ (uvicorn 0.54) with the loggers above instead of two lookups per
        # connection (the router sees one connection per request from clients that do not keep them), and
        # the app's settings read once per config. tests/unit/test_http_protocol.py checks that it sets
        # every attribute uvicorn's own sets, so an upgrade that adds one fails there, not in serving.
        if not config.loaded:
            config.load()
        self.config = config
        self.app = config.loaded_app
        self.loop = _loop or asyncio.get_event_loop()
        self.logger = _ERROR_LOG
        self.access_logger = _ACCESS_LOG
        self.access_log = _ACCESS_LOG.hasHandlers()
        self.parser = httptools.HttpRequestParser(self)
        self.parser.set_dangerous_leniencies(lenient_data_after_close=True)  # as uvicorn (httptools >= 0.6.3)
        self.ws_protocol_class = config.ws_protocol_class
        self.root_path = config.root_path
        self.asgi_version = config.asgi_version
        self.limit_concurrency = config.limit_concurrency
        self.app_state = app_state
        self.timeout_keep_alive_task = None
        self.timeout_keep_alive = config.timeout_keep_alive
        self.server_state = server_state
        self.connections = server_state.connections
        self.tasks = server_state.tasks
        self.transport = None
        self.flow = None
        self.server = None
        self.client = None
        self.scheme = None
        self.pipeline = deque()
        self.scope = None
        self.headers = None
        self.expect_100_continue = False
        self.cycle = None
        self._all_hot_routes: HotRoutes | None = getattr(config.app, "hot_routes", None)
        self._metrics_port: int = getattr(config.app, "metrics_port", 0)
        self.hot_routes: HotRoutes | None = None

    def connection_made(self, transport) -> None:
        # NOTE: uvicorn's connection_made with the addresses read from the event loop (see above).
        self.connections.add(self)
        self.transport = transport
        self.flow = FlowControl(transport)
        self.server = _address(transport.get_extra_info("sockname"))
        self.client = _address(transport.get_extra_info("peername"))
        self.scheme = "https" if is_ssl(transport) else "http"
        on_metrics_port = self._metrics_port and self.server is not None and self.server[1] == self._metrics_port
        self.hot_routes = None if on_metrics_port else self._all_hot_routes  # that port serves /metrics only

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        # NOTE: the last request's cycle (which holds this protocol's callbacks) and the pipeline let go:
        # otherwise protocol, cycle, transport and flow control stay in reference cycles, a dozen objects
        # per connection for the garbage collector (its passes were ~7 % of the router's CPU under load).
        self.cycle = None
        self.pipeline.clear()

    def on_message_begin(self) -> None:
        # NOTE: uvicorn's without the ASGI scope (two dicts and a copy of the app state per request), which
        # a hot route never reads: the ASGI path makes it in on_headers_complete (`asgi_scope`).
        self.url = b""
        self.expect_100_continue = False
        self.headers = []

    def asgi_scope(self) -> dict:
        """The scope uvicorn's on_message_begin makes (tests/unit/test_http_protocol.py compares them)."""
        return {"type": "http", "asgi": {"version": self.asgi_version, "spec_version": "2.3"}, "http_version": "1.1",
                "server": self.server, "client": self.client, "scheme": self.scheme, "root_path": self.root_path,
                "headers": self.headers, "state": self.app_state.copy()}

    def on_headers_complete(self) -> None:
        routes = self.hot_routes
        if routes is not None and self.limit_concurrency is None and self.parser.get_method() == b"POST":
            raw_path = httptools.parse_url(self.url).path
            handler = routes.handlers.get(raw_path)
            if handler is not None and not self.parser.should_upgrade():
                return self._start_hot(routes, handler, raw_path.decode("ascii"))
        self.scope = self.asgi_scope()
        super().on_headers_complete()

    def _start_hot(self, routes: HotRoutes, handler, path: str) -> None:
        declared = 0
        for name, value in self.headers:
            if name == b"content-length":
                declared = int(value) if value.isdigit() else 0  # httptools refuses a malformed one
                break
        keep_alive = self.parser.get_http_version() != "1.0" and self.parser.should_keep_alive()
        existing = self.cycle
        self.cycle = HotCycle(self, routes, handler, path, self.headers, keep_alive, self.expect_100_continue,
                              declared)
        # NOTE: as uvicorn does: a request pipelined behind one still being answered waits its turn
        # (on_response_complete starts it).
        if existing is None or existing.response_complete:
            self._start_asgi_task(self.cycle, None)
        else:
            self.flow.pause_reading()
            self.pipeline.appendleft((self.cycle, None))
