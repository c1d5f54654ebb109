"""The kubernetes actuator through the official client, over real HTTP, against a recorded fake API server.

The fake implements only GET and PATCH of apps/v1 deployments/{name}/scale (merge or strategic-merge patch of
spec.replicas), answers 404 in the API's Status shape for an unknown Deployment, and records every request. It
checks no authentication, no RBAC, no resourceVersion conflicts, and does not run pods (status.replicas follows
spec at once).
"""

import http.server
import json
import re
import threading
from typing import ClassVar

import pytest

from pdorch.planner.kubernetes import KubernetesActuator, load_api_client

SCALE_PATH = re.compile(r"^/apis/apps/v1/namespaces/([^/]+)/deployments/([^/]+)/scale$")


class FakeScaleApi(http.server.BaseHTTPRequestHandler):
    replicas: ClassVar[dict] = {}
    requests: ClassVar[list] = []

    def _target(self):
        m = SCALE_PATH.match(self.path.split("?")[0])
        key = (m.group(1), m.group(2)) if m else None
        if key not in self.replicas:
            self._send(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                             "code": 404, "message": f"deployments.apps \"{key}\" not found"})
            return None
        return key

    def _scale(self, key):
        n = self.replicas[key]
        return {"kind": "Scale", "apiVersion": "autoscaling/v1",
                "metadata": {"name": key[1], "namespace": key[0]}, "spec": {"replicas": n},
                "status": {"replicas": n, "selector": f"app={key[1]}"}}

    def do_GET(self):
        self.requests.append(("GET", self.path, None, None))
        key = self._target()
        if key:
            self._send(200, self._scale(key))

    def do_PATCH(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.requests.append(("PATCH", self.path, self.headers["Content-Type"], body))
        key = self._target()
        if key:
            self.replicas[key] = body["spec"]["replicas"]
            self._send(200, self._scale(key))

    def _send(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def api():
    FakeScaleApi.replicas = {("serving", "p"): 1, ("serving", "d"): 2}
    FakeScaleApi.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeScaleApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_reads_and_patches_the_deployments_scale(api):
    actuator = KubernetesActuator("serving", {"prefill": "p", "decode": "d"}, load_api_client(api), timeout_s=5)
    assert actuator.current() == {"prefill": 1, "decode": 2}
    FakeScaleApi.requests.clear()
    actuator.apply({"prefill": 3, "decode": 2})  # decode unchanged: not patched
    patches = [r for r in FakeScaleApi.requests if r[0] == "PATCH"]
    assert len(patches) == 1
    _method, path, content_type, body = patches[0]
    assert path.startswith("/apis/apps/v1/namespaces/serving/deployments/p/scale")
    assert body == {"spec": {"replicas": 3}} and "patch" in content_type
    assert actuator.current() == {"prefill": 3, "decode": 2}


def test_a_missing_deployment_is_an_api_error_naming_it(api):
    from kubernetes.client.exceptions import ApiException
    actuator = KubernetesActuator("serving", {"prefill": "p", "decode": "nope"}, load_api_client(api), timeout_s=5)
    with pytest.raises(ApiException) as e:
        actuator.current()
    assert e.value.status == 404 and "nope" in str(e.value.body)
