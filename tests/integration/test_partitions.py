"""Network partitions: master, prefill, decode and router on four hosts (network namespaces), one
link cut at a time during traffic (issue 14).

Each link is its own veth pair (tests/fixtures/netns.py mesh), downed at the callee's end, so the
caller's packets vanish silently, as in a real partition, the case where SGLang's decode workers
wait 300 s on a dead peer. For each cut: router<->decode, decode<->prefill, workers<->master:
every request ends within its deadline (served, or a clear JSON error), and once the link is back
traffic recovers with the same processes; at the end no page has leaked on either worker.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import grpc
import httpx
import pytest
import yaml

from proto.pdorch.v1 import worker_pb2 as pb
from proto.pdorch.v1 import worker_pb2_grpc as pb_grpc
from tests.fixtures.netns import NetnsLab, netns_available
from tests.fixtures.traffic import Traffic

pytestmark = [pytest.mark.skipif(netns_available() is not None, reason=f"network namespaces: {netns_available()}"),
              pytest.mark.timeout(360)]

DEADLINE_S = 8.0  # router.request_timeout_s: the client's whole-request deadline
SLACK_S = 3.0     # answering after the deadline fires (a loop turn, the error response)
CUT_S = DEADLINE_S + 3.0  # every request in flight at the cut meets its deadline while the link is down
PORTS = {"prefill": 50161, "decode": 50171, "router": 8390, "master_rpc": 50151, "metadata": 8180}


def _config(lab: NetnsLab, model_dir: Path, tmp: Path) -> Path:
    m, p, d = (lab.service_ip(h) for h in ("master", "prefill", "decode"))
    cfg = {"model": {"source": str(model_dir), "cache_dir": str(tmp / "models"), "torch_threads": 1},
           "store": {"enabled": True, "master_address": f"{m}:{PORTS['master_rpc']}",
                     "metadata_server": f"http://{m}:{PORTS['metadata']}/metadata", "master_metrics_port": 9103,
                     "global_segment_size_mb": 64, "local_buffer_size_mb": 16, "op_timeout_s": 2.0,
                     "reconnect_interval_s": 1.0},
           "prefill": {"host": "0.0.0.0", "port": PORTS["prefill"], "metrics_port": 9161, "num_pages": 128},
           "decode": {"host": "0.0.0.0", "port": PORTS["decode"], "metrics_port": 9171, "num_pages": 128},
           "router": {"host": "0.0.0.0", "port": PORTS["router"], "request_timeout_s": DEADLINE_S,
                      "health_check_interval_s": 0.5, "circuit_breaker_cooldown_s": 1.0},
           "discovery": {"mode": "static", "prefill": [f"{p}:{PORTS['prefill']}"],
                         "decode": [f"{d}:{PORTS['decode']}"]}}
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _body(client: int, n: int) -> dict:
    return {"input_ids": [(client * 131 + n % 4 * 17 + i * 7) % 900 + 20 for i in range(48)],
            "sampling_params": {"max_new_tokens": 6, "temperature": 0.0}}


def _wait(what: str, check, timeout_s: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            if check():
                return time.monotonic() - t0
        except (httpx.HTTPError, grpc.RpcError, OSError):
            pass
        time.sleep(0.3)
    raise AssertionError(f"{what} not within {timeout_s}s")


def _stats(lab: NetnsLab, role: str) -> pb.WorkerStats:
    stub_cls = pb_grpc.PrefillServiceStub if role == "prefill" else pb_grpc.DecodeServiceStub
    with grpc.insecure_channel(f"{lab.ip(role)}:{PORTS[role]}") as ch:
        return stub_cls(ch).Stats(pb.StatsRequest(), timeout=10)


def _idle_and_sound(lab: NetnsLab, role: str) -> bool:
    st = _stats(lab, role)
    if st.active_pages or st.info.running_requests or st.info.queued_requests:
        return False
    assert st.pool_integrity_ok, f"{role} pool integrity: {st.pool_integrity_error}"
    assert st.info.free_pages == st.info.total_pages, f"{role} leaked pages: {st.info}"
    return True


def _check_outcomes(results: list[tuple], phase: str) -> dict:
    counts: dict = {}
    for t0, t1, status, body in results:
        counts[status] = counts.get(status, 0) + 1
        assert status is not None, f"{phase}: a request got no HTTP answer: {body}"
        assert t1 - t0 <= DEADLINE_S + SLACK_S, f"{phase}: a request took {t1 - t0:.1f}s (deadline {DEADLINE_S}s)"
        if status != 200:
            assert status in (429, 502, 503, 504), f"{phase}: unclear status {status}: {body}"
            assert body["error"]["message"], f"{phase}: error without a message: {body}"
    return counts


def test_partitions_end_requests_by_their_deadline_and_heal(tiny_model_dir, tmp_path):
    from engine.prepare import prepare_model
    prepare_model(str(tiny_model_dir), str(tmp_path / "models"), progress=lambda m: None)  # once, not 3x in parallel
    lab = NetnsLab()
    try:
        for host in ("master", "prefill", "decode", "router"):
            lab.add_host(host)
        lab.connect_mesh()
        config = _config(lab, tiny_model_dir, tmp_path)
        procs = {}
        commands = {"master": [str(Path(sys.executable).parent / "pdorch"), "master", "--listen", "0.0.0.0"],
                    "prefill": [sys.executable, "-m", "prefill_node"], "decode": [sys.executable, "-m", "decode_node"],
                    "router": [sys.executable, "-m", "router"]}
        for host, argv in commands.items():
            env = {"PATH": "/usr/bin:/bin", "PDORCH_STORE_LOCAL_HOSTNAME": lab.service_ip(host)}
            procs[host] = lab.spawn(host, [*argv, "--config", str(config)], env, tmp_path / f"{host}.log")
            if host == "master":
                time.sleep(1.0)
        url = f"http://{lab.ip('router')}:{PORTS['router']}"
        _wait("router /health", lambda: httpx.get(f"{url}/health", timeout=2).status_code == 200, 180)
        pids = {h: p.pid for h, p in procs.items()}

        with Traffic(url, _body, timeout_s=DEADLINE_S + 20) as traffic:
            time.sleep(3.0)
            assert [r for r in traffic.results if r[2] == 200], f"no request served before any cut: {traffic.results}"
            report = {}
            for phase, links in (("router-decode", [("router", "decode")]), ("decode-prefill", [("decode", "prefill")]),
                                 ("workers-master", [("prefill", "master"), ("decode", "master")])):
                t_cut = time.monotonic()
                for a, b in links:
                    lab.cut(a, b)
                time.sleep(CUT_S)
                for a, b in links:
                    lab.heal(a, b)
                t_heal = time.monotonic()
                recovered = _wait(f"a request served after healing {phase}",
                                  lambda t=t_heal: any(r[2] == 200 for r in traffic.since(t)), 60)
                report[phase] = (_check_outcomes([r for r in traffic.since(t_cut) if r[0] < t_heal], phase),
                                 round(recovered, 1))
            time.sleep(1.0)
        _check_outcomes(traffic.results, "all")
        print("outcomes during each cut, and seconds to the first request served after healing:", report)
        assert {h: p.pid for h, p in procs.items() if p.poll() is None} == pids, "a process died or was restarted"
        for role in ("prefill", "decode"):
            _wait(f"{role} idle with every page back", lambda r=role: _idle_and_sound(lab, r), 30)
    finally:
        lab.close()
        for host in ("master", "prefill", "decode", "router"):
            log = tmp_path / f"{host}.log"
            if log.exists():
                print(f"--- {host} ---\n" + log.read_text()[-2500:])
