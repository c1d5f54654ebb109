"""API key and admin key on every route, against the router app with stand-in workers: missing,
wrong and right keys; admin routes refuse the client key; probes stay open. Keys never appear in
the router's log records (any logger, any level), in /metrics or in an error body."""

from __future__ import annotations

import logging

import httpx
import pytest

from pdorch.local_stack.processes import free_port
from pdorch.local_stack.router import RouterThread, router_config
from pdorch.local_stack.standin import StandinServer
from router.http.app import _ROUTES

API_KEY = "sk-client-7d1e0c5a93"
ADMIN_KEY = "sk-admin-4b8f2d6e10"
MODEL = "SmolLM2-135M-Instruct"

# (method, path, body): every route a client uses
CLIENT_ROUTES = [
    ("POST", "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                      "max_tokens": 2}),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2}),
    ("POST", "/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 2}),
    ("POST", "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2}}),
    ("GET", "/v1/models", None),
    ("GET", "/server_info", None),
    ("GET", "/get_server_info", None),
    ("GET", "/get_model_info", None),
    ("POST", "/tokenize", {"prompt": "hi"}),
    ("POST", "/detokenize", {"tokens": [1, 2]}),
]
ADMIN_ROUTES = [("GET", "/workers", None), ("POST", "/flush_cache", None), ("GET", "/flush_cache", None)]
# Probes and scrapes: Kubernetes and Prometheus call them without credentials (docs/operations.md).
OPEN_ROUTES = [("GET", "/health", None), ("GET", "/health_generate", None), ("GET", "/metrics", None)]


def test_the_lists_cover_every_route():
    covered = {path for _, path, _ in CLIENT_ROUTES + ADMIN_ROUTES + OPEN_ROUTES}
    assert covered == _ROUTES | {"/get_server_info"}


class Captured(logging.Handler):
    """Every log record of every logger, formatted with its arguments and exception text."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(self.format(record))


@pytest.fixture(scope="module")
def keyed(router_tokenizer, tiny_model_dir):
    """One router with both keys for the module (the requests change nothing), its logs captured."""
    root = logging.getLogger()
    captured, old_level = Captured(), root.level
    root.addHandler(captured)
    root.setLevel(logging.DEBUG)
    p, d = StandinServer("prefill", free_port()).start(), StandinServer("decode", free_port()).start()
    cfg = router_config([p.address], [d.address], policy="round_robin", api_key=API_KEY, admin_key=ADMIN_KEY)
    r = RouterThread(cfg, router_tokenizer, tiny_model_dir).start()
    try:
        with httpx.Client(base_url=r.url, timeout=20) as c:
            yield c, captured
    finally:
        r.stop()
        p.stop()
        d.stop()
        root.removeHandler(captured)
        root.setLevel(old_level)


def call(c: httpx.Client, method: str, path: str, body, key: str | None, scheme: str = "Bearer") -> httpx.Response:
    headers = {"Authorization": f"{scheme} {key}".strip()} if key is not None else {}
    return c.request(method, path, json=body, headers=headers)


def assert_refused(resp: httpx.Response, status: int, words: str) -> None:
    assert resp.status_code == status, (resp.request.url, resp.text)
    err = resp.json()["error"]
    assert words in err["message"], err
    assert err["type"] == ("authentication_error" if status == 401 else "permission_error")
    if status == 401:
        assert resp.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize("method,path,body", CLIENT_ROUTES, ids=[r[1] for r in CLIENT_ROUTES])
def test_client_routes_need_the_api_key(keyed, method, path, body):
    c, _ = keyed
    assert_refused(call(c, method, path, body, None), 401, "missing API key")
    assert_refused(call(c, method, path, body, API_KEY + "x"), 401, "invalid API key")
    assert_refused(call(c, method, path, body, API_KEY[:-1]), 401, "invalid API key")
    assert_refused(call(c, method, path, body, API_KEY, scheme="Basic"), 401, "missing API key")
    assert_refused(call(c, method, path, body, ""), 401, "missing API key")
    assert call(c, method, path, body, API_KEY).status_code == 200
    assert call(c, method, path, body, API_KEY, scheme="bearer").status_code == 200  # the scheme is case-blind
    assert call(c, method, path, body, ADMIN_KEY).status_code == 200  # the admin key may do what clients do


@pytest.mark.parametrize("method,path,body", ADMIN_ROUTES, ids=[f"{r[0]} {r[1]}" for r in ADMIN_ROUTES])
def test_admin_routes_need_the_admin_key_and_refuse_the_api_key(keyed, method, path, body):
    c, _ = keyed
    assert_refused(call(c, method, path, body, None), 401, "missing admin key")
    assert_refused(call(c, method, path, body, ADMIN_KEY + "x"), 401, "invalid admin key")
    assert_refused(call(c, method, path, body, API_KEY), 403, "needs the admin key")
    assert call(c, method, path, body, ADMIN_KEY).status_code == 200


@pytest.mark.parametrize("method,path,body", OPEN_ROUTES, ids=[r[1] for r in OPEN_ROUTES])
def test_probes_and_metrics_stay_open(keyed, method, path, body):
    c, _ = keyed
    assert call(c, method, path, body, None).status_code == 200
    assert call(c, method, path, body, "wrong").status_code == 200


def test_without_an_admin_key_admin_routes_take_the_api_key(standins, make_router):
    p, d = standins("prefill"), standins("decode")
    r = make_router([p.address], [d.address], policy="round_robin", api_key=API_KEY)
    with httpx.Client(base_url=r.url, timeout=20) as c:
        assert_refused(call(c, "GET", "/workers", None, None), 401, "missing API key")
        assert call(c, "GET", "/workers", None, API_KEY).status_code == 200


def test_with_only_an_admin_key_clients_are_open_and_admin_routes_are_not(standins, make_router):
    p, d = standins("prefill"), standins("decode")
    r = make_router([p.address], [d.address], policy="round_robin", admin_key=ADMIN_KEY)
    with httpx.Client(base_url=r.url, timeout=20) as c:
        method, path, body = CLIENT_ROUTES[2]
        assert call(c, method, path, body, None).status_code == 200
        assert_refused(call(c, "POST", "/flush_cache", None, "guess"), 401, "invalid admin key")
        assert call(c, "POST", "/flush_cache", None, ADMIN_KEY).status_code == 200


def test_during_a_key_rotation_the_previous_key_works_too_but_not_on_admin_routes(standins, make_router):
    p, d = standins("prefill"), standins("decode")
    old, new = "sk-old-0e7d2c", "sk-new-91ab4f"
    r = make_router([p.address], [d.address], policy="round_robin", api_key=new, previous_api_key=old,
                    admin_key=ADMIN_KEY)
    with httpx.Client(base_url=r.url, timeout=20) as c:
        method, path, body = CLIENT_ROUTES[2]
        assert call(c, method, path, body, new).status_code == 200
        assert call(c, method, path, body, old).status_code == 200
        assert_refused(call(c, method, path, body, old + "x"), 401, "invalid API key")
        assert_refused(call(c, "GET", "/workers", None, old), 403, "needs the admin key")
    # the rotation's second step: the previous key is gone, and with it its access
    r2 = make_router([p.address], [d.address], policy="round_robin", api_key=new)
    with httpx.Client(base_url=r2.url, timeout=20) as c:
        assert_refused(call(c, method, path, body, old), 401, "invalid API key")
        assert call(c, method, path, body, new).status_code == 200


def test_keys_never_appear_in_logs_metrics_or_error_bodies(keyed):
    c, captured = keyed
    bodies = []
    for method, path, body in CLIENT_ROUTES + ADMIN_ROUTES + OPEN_ROUTES:
        for key in (None, API_KEY, ADMIN_KEY, API_KEY + "x", ADMIN_KEY + "x"):
            resp = call(c, method, path, body, key)
            if resp.status_code >= 400:
                bodies.append(resp.text)
    # an unexpected error must not leak them either: a bad body after a good key
    bodies.append(c.post("/generate", content=b"{", headers={"Authorization": f"Bearer {API_KEY}"}).text)
    assert len(bodies) > 20
    metrics = call(c, "GET", "/metrics", None, None).text
    assert "pdorch_router_requests_total" in metrics
    logged = "\n".join(captured.lines)
    for secret in (API_KEY, ADMIN_KEY):
        assert secret not in metrics
        assert not [b for b in bodies if secret in b]  # not even the near-miss key a client sent
        assert secret not in logged


def test_admin_query_parameters_are_checked_after_the_key_and_answered_openai_style(keyed):
    c, _ = keyed
    assert_refused(c.post("/flush_cache?store=abc"), 401, "missing admin key")  # was FastAPI's 422 first
    resp = c.post("/flush_cache?store=abc", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == "store" and "must be true or false, got 'abc'" in err["message"]
    assert c.post("/flush_cache?store=false", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).status_code == 200
    spec = c.get("/openapi.json").json()
    assert spec["paths"]["/flush_cache"]["post"]["parameters"][0]["name"] == "store"


def test_without_an_api_key_a_generation_request_never_builds_its_headers():
    """Auth off: check_request reads no header, so the hot path's request (router/http/hot_path.py
    HotRequest) never builds its Headers mapping; with a key the header is read and checked."""
    from router.errors import APIError
    from router.http.auth import Auth
    from router.http.hot_path import HotRequest

    request = HotRequest("/generate", [(b"authorization", b"Bearer wrong")])
    Auth().check_request(request)
    assert request._headers is None
    with pytest.raises(APIError) as refused:
        Auth(api_key=API_KEY).check_request(request)
    assert refused.value.status == 401 and request._headers is not None
    Auth(api_key=API_KEY).check_request(HotRequest("/generate", [(b"authorization", f"Bearer {API_KEY}".encode())]))
