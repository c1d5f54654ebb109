"""The planner's HTTP port (planner.metrics_port): /metrics (Prometheus text) and /status (JSON, `pdorch status`).

/status is the last decision as `PlannerRunner.status()` made it after its step: per role the desired and current
replicas, the action and its reason; when the decision was made; the SLO targets and their attainment. The server
runs on a daemon thread the runner owns and stops (`shutdown` + `server_close`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


def start_server(port: int, registry: CollectorRegistry, status: Callable[[], dict],
                 host: str = "") -> ThreadingHTTPServer:
    """Serve /metrics and /status on `port` (0: a free one; see server.server_address) until shutdown()."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # http.server calls it by this name
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, CONTENT_TYPE_LATEST, generate_latest(registry))
            elif path == "/status":
                self._send(200, "application/json", json.dumps(status()).encode())
            else:
                self._send(404, "application/json", json.dumps(
                    {"error": {"message": f"no route {path}; the planner serves /metrics and /status",
                               "type": "not_found_error"}}).encode())

        def _send(self, code: int, content_type: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # a scrape every few seconds is not worth a log line
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="planner-http", daemon=True).start()
    return server
