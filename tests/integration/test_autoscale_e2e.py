"""Issue 52's acceptance on the real local stack: `pdorch serve --autoscale` (a real subprocess, tiny model,
planner.mode act, 1..3 replicas per role, a 2 s interval) under a bounded streaming load that steps up, then
down.

    quiet      1 prefill + 1 decode
    up         HIGH_CLIENTS clients stream short greedy requests back to back: the fleet grows to 3 + 3
    turns      the first turns of CONVERSATIONS conversations, one at a time (round_robin: two per prefill
               worker), each one's prefill worker read from the router's per-worker counts
    down       the load drops to KEEPER_CLIENTS long greedy streams: the fleet shrinks to 1 + 1 while they run;
               the leaving decode workers hand their streams on (decode.drain_timeout_s 0), the leaving
               prefill workers write their L1 back (store.write_policy write_back: only the drain puts the
               first turns' pages in the store)
    bounds     the planner asks for 3 + 3 within 4 intervals (+1 s) of the load's start, and for 1 + 1 within
               planner.down_cooldown_s + 8 intervals of its drop; the router routes to exactly that many workers
               within 120 s (model loads) and 30 s (drains) after
    check      no request failed; every long stream equals the same prompt streamed again on the settled
               fleet; streams were handed on; the next turns of the conversations whose first turn ran on a
               removed prefill worker read that turn's pages from the store

The profile is an input chosen for this machine, not a measurement: its per-replica capacities are so small
that HIGH_CLIENTS short requests on 2 shared cores need 3 replicas of each role, and the long streams of the
down phase need one (a decode replica takes many streams at the long streams' context: the profile says so).
With planner.replica_startup_s 0 the planner sizes for the next interval's forecast (plus its margin).

The store's memory is the store-memory node's (store.memory_node_segment_mb): every worker is a pure client,
so a removed worker takes no page with it. DRAIN_OFF (edit it to True) runs the same test with the drain's
hand-off and write-back off: it then fails (failed streams, no store reads).
"""

from __future__ import annotations

import json
import random
import re
import time
from pathlib import Path

import httpx
import pytest

from pdorch.local_stack.processes import free_port
from tests.fixtures.stream_load import StreamLoad, run_streams
from tests.integration.test_serve import children_of, pdorch_command
from tests.integration.test_serve_supervision import serve_env, serve_process, wait_serve_ready

REPO = Path(__file__).resolve().parents[2]
INTERVAL_S = 2.0
DOWN_COOLDOWN_S = 4.0
HIGH_CLIENTS = 6
KEEPER_CLIENTS = 4
LONG_TOKENS = 600  # a long stream's mean context (8 + 600 / 2) is past the profile's 64: many per replica
CONVERSATIONS = 6
FIRST_TURN = 48  # prompt tokens of a first turn: 3 full pages
DRAIN_OFF = False
# a leaving prefill worker's drain: prefill.drain_timeout_s + prefill.drain_writeback_s + the server's shutdown
# (pdorch/worker/drain.py drain_budget_s: 20 s), with room for a loaded machine
DRAIN_EXIT_S = 60.0

# A prefill replica takes ~190 uncached prompt tokens/s (200 at utilisation ~0.95 within the TTFT target); a
# decode replica 1 stream at short contexts (p90 ITL 0.1 s), up to 64 from 64 tokens on (ITL 0.001 s). NOTE: the
# planner takes no batch larger than the contexts around a stream's mean context measured, so below 64 tokens a
# replica holds 1. Only the short requests (48 + 16 tokens: mean context 56) and the first turns (48 + 17) may sit
# below that step. Every load after the scale-down must stay above it, mixes included: the planner's context is a
# moving average over intervals, so a window with the long streams (8 + 600: 308) and the next turns (68 + 4: 70)
# lands anywhere between 70 and 308 (with the step at 64..128 such a mix at 120 tokens scaled decode up again
# after the scale-down; with it at 256, a predicted mean output of 488 tokens did).
# HIGH_CLIENTS short requests run at 25-55 req/s here (> 6.3 req/s holds 3 of each); the long
# streams (8 + 600 tokens) at ~2 req/s need 1 of each. NOTE: the planner sizes for an upper bound that remembers
# the high phase's forecast errors for planner.error_window intervals (~12 req/s after the drop, 100 tok/s of
# 8-token prompts): the prefill capacity keeps that under 1 replica's 90%, or prefill goes 1 -> 2 -> 1.
PROFILE = {
    "version": 1, "model": "tiny", "device": "cpu", "created": "2026-01-01T00:00:00Z",
    "prefill": [{"prompt_tokens": 8, "tokens_per_s": 200.0, "ttft_s": 0.01},
                {"prompt_tokens": 512, "tokens_per_s": 200.0, "ttft_s": 0.01}],
    "decode": [{"batch": 1, "context_tokens": 60, "tokens_per_s": 10.0, "itl_s": 0.1},
               {"batch": 1, "context_tokens": 64, "tokens_per_s": 1000.0, "itl_s": 0.001},
               {"batch": 64, "context_tokens": 64, "tokens_per_s": 64000.0, "itl_s": 0.001},
               {"batch": 64, "context_tokens": 1024, "tokens_per_s": 64000.0, "itl_s": 0.001}],
}


def short_body(n: int) -> dict:
    rng = random.Random(n)
    return {"input_ids": [rng.randrange(10, 900) for _ in range(48)],
            "sampling_params": {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}}


def long_body(n: int) -> dict:
    rng = random.Random(10_000 + n)
    return {"input_ids": [rng.randrange(10, 900) for _ in range(8)],
            "sampling_params": {"max_new_tokens": LONG_TOKENS, "temperature": 0, "ignore_eos": True}}


def first_turn(c: int) -> list[int]:
    return list(range(40 + 7 * c, 40 + 7 * c + FIRST_TURN))


@pytest.fixture
def serve(tmp_path, tiny_model_dir):
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(PROFILE))
    router_port, planner_port, master_metrics = free_port(), free_port(), free_port()
    sets = [f"store.master_address=127.0.0.1:{free_port()}", f"store.metadata_server=http://127.0.0.1:{free_port()}/metadata",
            f"store.master_metrics_port={master_metrics}", "store.memory_node_segment_mb=256",
            "store.write_policy=write_back", f"router.port={router_port}", "router.policy=round_robin",
            "router.health_check_interval_s=2", f"model.source={tiny_model_dir}",
            f"model.cache_dir={tmp_path / 'models'}", "model.torch_threads=1", "discovery.lease_ttl_s=5",
            "decode.offload_generated_kv=true", "decode.drain_timeout_s=0", "decode.drain_writeback_s=5",
            "decode.prefix_cache=false", "decode.max_local_prefill_tokens=0",
            "prefill.drain_timeout_s=5", "prefill.drain_writeback_s=10",
            "planner.mode=act", f"planner.interval_s={INTERVAL_S}", f"planner.profile_path={profile}",
            "planner.min_prefill=1", "planner.max_prefill=3", "planner.min_decode=1", "planner.max_decode=3",
            "planner.up_cooldown_s=0", f"planner.down_cooldown_s={DOWN_COOLDOWN_S}", "planner.replica_startup_s=0",
            "planner.ttft_p90_s=60", "planner.itl_p90_s=10",
            f"planner.metrics_port={planner_port}"]
    if DRAIN_OFF:
        sets += ["router.mid_stream_failover=off", "decode.drain_writeback_s=0", "prefill.drain_writeback_s=0"]
    argv = pdorch_command() + ["serve", "--autoscale", "--log-dir", str(tmp_path / "logs")]
    argv += [a for s in sets for a in ("--set", s)]
    out_path = tmp_path / "serve.out"
    env = dict(serve_env(), PYTHONPATH=str(REPO))  # this checkout's pdorch, not the installed one
    with serve_process(argv, out_path, env, stop_timeout_s=60) as (proc, seen):
        wait_serve_ready(proc, out_path)
        seen |= set(children_of(proc.pid))
        yield (f"http://127.0.0.1:{router_port}", f"http://127.0.0.1:{planner_port}", out_path, proc,
               f"http://127.0.0.1:{master_metrics}/metrics")


def routed(url: str) -> dict[str, dict]:
    return {w["address"]: w for w in httpx.get(url + "/workers", timeout=30).json()["workers"]}


def serving(url: str) -> tuple[int, int]:
    roles = [w["role"] for w in routed(url).values() if w["healthy"]]
    return roles.count("prefill"), roles.count("decode")


def planner_status(planner: str) -> dict:
    try:
        return httpx.get(planner + "/status", timeout=10).json()
    except httpx.HTTPError as e:
        return {"error": repr(e)}


def wait_fleet(url: str, planner: str, want: tuple[int, int], timeout_s: float, out_path, during) -> float:
    """Seconds until the router routes to exactly `want` (prefill, decode) workers and nothing more drains."""
    t0 = time.monotonic()
    while serving(url) != want or planner_current(planner) != want:
        assert not any(not r.ok for r in during.results), [r.error for r in during.results if not r.ok][:3]
        assert time.monotonic() - t0 < timeout_s, (
            f"fleet {serving(url)}, want {want} within {timeout_s:.0f} s; planner {planner_status(planner)}\n"
            + out_path.read_text(errors="replace")[-3000:])
        time.sleep(0.2)
    return time.monotonic() - t0


def wait_exited(serve_pid: int, module: str, want: int, timeout_s: float, out_path) -> float:
    """Seconds until `serve_pid` has exactly `want` live children running `-m module`."""
    t0 = time.monotonic()
    while (n := sum(f"-m {module} " in cmd for cmd in children_of(serve_pid).values())) != want:
        assert time.monotonic() - t0 < timeout_s, (
            f"{n} {module} processes, want {want} within {timeout_s:.0f} s\n"
            + out_path.read_text(errors="replace")[-3000:])
        time.sleep(0.2)
    return time.monotonic() - t0


def planner_current(planner: str, field: str = "current") -> tuple[int, int] | None:
    roles = planner_status(planner).get("roles")
    return (roles["prefill"][field], roles["decode"][field]) if roles else None


def wait_planner(planner: str, field: str, want: tuple[int, int], timeout_s: float, out_path, during) -> float:
    """Seconds until the planner's last decision has `field` (current, desired) == want."""
    t0 = time.monotonic()
    while planner_current(planner, field) != want:
        assert not any(not r.ok for r in during.results), [r.error for r in during.results if not r.ok][:3]
        assert time.monotonic() - t0 < timeout_s, (
            f"planner {field} not {want} within {timeout_s:.0f} s: {planner_status(planner)}\n"
            + out_path.read_text(errors="replace")[-3000:])
        time.sleep(0.1)
    return time.monotonic() - t0


def failovers(url: str, outcome: str) -> float:
    text = httpx.get(url + "/metrics", timeout=30).text
    m = re.search(rf'^pdorch_router_failovers_total{{outcome="{outcome}"}} (\S+)$', text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0


def planner_decisions(out_path: Path) -> list[dict]:
    """The planner's decisions so far, from its log."""
    return [json.loads(line.split("planner decision ", 1)[1])
            for line in (out_path.parent / "logs" / "planner.log").read_text().splitlines()
            if "planner decision " in line]


def generate(url: str, input_ids: list[int], max_tokens: int) -> dict:
    r = httpx.post(url + "/generate", timeout=120, json={
        "input_ids": input_ids, "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0,
                                                    "ignore_eos": True}})
    assert r.status_code == 200, r.text
    return r.json()


def test_the_fleet_follows_a_load_step_up_and_down_and_its_scale_down_loses_nothing(serve):
    url, planner, out_path, proc, master_metrics = serve
    assert serving(url) == (1, 1)
    timings = {}

    # up: the planner asks for 3 + 3 within a few intervals of the load, the new workers load the model
    with StreamLoad(url, short_body, HIGH_CLIENTS) as high:
        timings["up_decided"] = wait_planner(planner, "desired", (3, 3), 4 * INTERVAL_S + 1, out_path, high)
        timings["up_serving"] = wait_fleet(url, planner, (3, 3), 120, out_path, high) + timings["up_decided"]
    high_results = list(high.results)

    # the conversations' first turns, one at a time (the load paused for a moment): which prefill worker
    turns = []
    for c in range(CONVERSATIONS):
        before = {a: w["routed"] for a, w in routed(url).items() if w["role"] == "prefill"}
        turn = generate(url, first_turn(c), 17)
        after = {a: w["routed"] for a, w in routed(url).items() if w["role"] == "prefill"}
        ran_on = [a for a in after if after[a] > before.get(a, 0)]
        assert len(ran_on) == 1, (before, after)
        turns.append((c, turn, ran_on[0]))
    # round_robin spreads them (two per worker, unless a health check or a retry moved the rotation on): at least
    # two workers got some, so whichever stays after the scale-down, a removed one ran some first turns
    assert len({ran_on for _, _, ran_on in turns}) >= 2, turns

    # down: the long streams start under the high load (so every decode worker runs some), then the high
    # load stops: the fleet shrinks to 1 + 1 while the long streams run
    resumed_before = failovers(url, "resumed")
    with StreamLoad(url, long_body, KEEPER_CLIENTS) as low:
        with StreamLoad(url, short_body, HIGH_CLIENTS) as high:
            time.sleep(INTERVAL_S)
        high_results += high.results
        timings["down_decided"] = wait_planner(planner, "desired", (1, 1), DOWN_COOLDOWN_S + 8 * INTERVAL_S,
                                               out_path, low)
        timings["down_serving"] = wait_fleet(url, planner, (1, 1), 30, out_path, low) + timings["down_decided"]
        # a leaving prefill worker writes its L1 back as its drain's last step, after the router dropped it:
        # the next turns below read the store once the leaving ones exited. NOTE: runs where the up phase
        # lasted long enough to fill the leaving workers' L1 (CI) read 16 of 48 tokens: the drain wrote its
        # ~500 pages in one save, past the I/O queue's budget (256), which dropped it whole (now in chunks,
        # pdorch/worker/drain_writes.py; tests/integration/test_write_budget.py)
        timings["down_exited"] = wait_exited(proc.pid, "prefill_node", 1, DRAIN_EXIT_S, out_path)
    # NOTE: the decisions while the long streams ran; the reruns below start from idle, all at once and at short
    # contexts, where the profile gives a decode replica 1 stream: under a loaded machine (two test files at a
    # time) they stay short long enough for a decision to see them and scale decode up again, as it should
    low_phase_decisions = len(planner_decisions(out_path))
    moved = failovers(url, "resumed") - resumed_before
    failed = [r for r in high_results + low.results if not r.ok]
    assert not failed, [r.error for r in failed][:5]
    assert len(high_results) >= 2 * HIGH_CLIENTS and len(low.results) >= KEEPER_CLIENTS
    assert moved > 0, "no stream was handed on: the scale-down found none in flight on a leaving decode worker"
    assert failovers(url, "failed") == 0

    # every long stream, moved or not, equals the same prompt streamed on the settled fleet
    again = run_streams(url, [r.body for r in low.results], KEEPER_CLIENTS)
    assert [r.error for r in again if not r.ok] == []
    assert [r.output_ids for r in low.results] == [r.output_ids for r in again]
    assert [r.text for r in low.results] == [r.text for r in again]
    assert all(len(r.output_ids) == LONG_TOKENS for r in again)

    # the next turns of the conversations whose first turn ran on a removed prefill worker read the store
    staying = {a for a, w in routed(url).items() if w["role"] == "prefill"}
    removed = [(c, turn) for c, turn, ran_on in turns if ran_on not in staying]
    assert removed, turns  # two of three prefill workers left
    for c, turn in removed:
        second = generate(url, first_turn(c) + turn["output_ids"] + [7, 8, 9], 4)
        details = second["meta_info"]["cached_tokens_details"]
        assert details["store"] >= FIRST_TURN, (c, second["meta_info"])
    # the store's pages are in one segment, the store-memory node's: every worker was a pure client
    segments = re.findall(r'^segment_allocated_bytes{segment="([^"]+)"} (\S+)$', httpx.get(master_metrics).text,
                          re.MULTILINE)
    assert len(segments) == 1 and float(segments[0][1]) > 0, segments
    decisions = planner_decisions(out_path)[:low_phase_decisions]
    assert {"up", "down"} <= {a for d in decisions for a in d["actions"].values()}, decisions[-3:]
    # no flapping: once down at 1 + 1 under the long streams it stays there while they run
    first_down = next(i for i, d in enumerate(decisions)
                      if d["desired"] == {"prefill": 1, "decode": 1} and "down" in d["actions"].values())
    assert all(d["desired"] == {"prefill": 1, "decode": 1} for d in decisions[first_down:]), \
        [(d["desired"], d["reason"]) for d in decisions[first_down:]]
    print(f"timings {timings}, streams moved {moved:g}, high {len(high_results)} low {len(low.results)}")
    assert proc.poll() is None
