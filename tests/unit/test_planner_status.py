"""`pdorch status` shows the planner: the runner's /status over real HTTP, the planner block, and its absence."""

import json
import socket
import urllib.error
import urllib.request
from dataclasses import replace

import pytest

from pdorch.config_loader import load_config
from pdorch.status import fetch_planner, planner_url, render_status
from tests.unit.test_planner_runner import runner


def quiet_runner(mode: str, port: int):
    """test_planner_runner's runner whose loop waits a minute: only the test's own step() decides."""
    r, _ = runner(mode, port)
    r.cfg = replace(r.cfg, planner=replace(r.cfg.planner, interval_s=60.0))
    return r


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_planner_status_over_http_and_in_pdorch_status():
    port = free_port()
    r = quiet_runner("act", port)
    r.step()  # the load of test_planner_decide: prefill 1 -> 5, decode 1 -> 6 (its max); ITL 0.2 s over 0.09 s
    r.start()
    try:
        url = planner_url(load_config(None, {"planner.metrics_port": str(port)}).planner)
        assert url == f"http://127.0.0.1:{port}"
        planner = fetch_planner(url)
        assert planner is not None and planner["mode"] == "act" and planner["actuator"] == "external"
        prefill, decode = planner["roles"]["prefill"], planner["roles"]["decode"]
        assert (prefill["current"], prefill["desired"], prefill["action"]) == (1, 5, "up")
        assert "needs 5: up 1 -> 5" in prefill["reason"]
        assert decode["desired"] == 6 and decode["short_at_max"] and decode["max"] == 6
        assert planner["slo_attainment"] == {"ttft": 1.0, "itl": 0.0}
        assert planner["last_decision_at"] > 0
        text = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()  # /metrics beside it
        assert "pdorch_planner_desired_replicas" in text
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{url}/nothing", timeout=5)
        assert e.value.code == 404 and "error" in json.loads(e.value.read())

        shown = render_status({"url": "http://r", "workers": [], "tokens": {}, "planner": planner})
        block = shown[shown.index("planner (http://127.0.0.1"):]
        assert "act, actuator external, last decision" in block
        assert "prefill: 1 -> 5 (up; min 1, max 10)" in block and "needs 5: up 1 -> 5" in block
        assert "decode: 1 -> 6 (up; min 1, max 6) SHORT AT MAX" in block
        assert "ttft p90 <= " in block and "met in 100%" in block and "itl p90 <= 0.09s met in 0%" in block
    finally:
        assert r.stop(timeout_s=5)


def test_before_the_first_decision_status_says_so():
    port = free_port()
    r = quiet_runner("dry-run", port)
    r.start()
    try:
        planner = fetch_planner(f"http://127.0.0.1:{port}")
        assert planner["roles"] == {} and planner["last_decision_at"] is None
        assert "no decision yet" in render_status({"url": "u", "workers": [], "tokens": {}, "planner": planner})
    finally:
        assert r.stop(timeout_s=5)


def test_no_planner_no_block():
    assert fetch_planner(f"http://127.0.0.1:{free_port()}") is None  # nothing listens there
    assert fetch_planner(None) is None
    assert planner_url(load_config(None, {"planner.metrics_port": "0"}).planner) is None
    assert planner_url(load_config(None, {"planner.status_url": "http://planner:9490/"}).planner) == \
        "http://planner:9490"
    assert "planner" not in render_status({"url": "u", "workers": [], "tokens": {}})
