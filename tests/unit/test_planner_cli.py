"""`pdorch planner`: the refusals name what is wrong; --once decides from a router's real /metrics over HTTP."""

import http.server
import json
import threading

from pdorch.cli import main
from pdorch.planner.profile import save_profile
from tests.unit.test_planner_capacity import PROFILE
from tests.unit.test_planner_observe import AFTER, BEFORE, _Handler


def test_local_actuator_and_missing_profile_are_refused(capsys):
    assert main(["planner", "--set", "planner.actuator=local"]) == 2
    assert "runs only inside it" in capsys.readouterr().err
    assert main(["planner", "--set", "planner.actuator=external"]) == 2
    assert "planner.profile_path is empty" in capsys.readouterr().err


def test_once_prints_the_decision(tmp_path, capsys):
    save_profile(PROFILE, tmp_path / "profile.json")
    _Handler.texts = [BEFORE, AFTER]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        rc = main(["planner", "--once", "--set", f"planner.profile_path={tmp_path / 'profile.json'}",
                   "--set", f"planner.router_urls=http://127.0.0.1:{server.server_address[1]}",
                   "--set", "planner.interval_s=1", "--set", "planner.metrics_port=0"])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    # about 20 req/s of 200-token prompts, half cached: ~2000 uncached tok/s, one prefill replica at the default
    # 2 s TTFT; 100 output tokens at ITL 0.08 (16 streams, default SLO 0.1): ~160 streams, 10 replicas -> max 4
    assert out["desired"] == {"prefill": 1, "decode": 4} and "decode: " in out["reason"]
