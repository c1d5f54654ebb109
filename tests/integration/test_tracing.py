"""Traces through the real stack (issue 54): router (in this process), one prefill and one decode worker
process, mooncake_master, tiny model; every process exports over OTLP to a receiver this test serves
(pdorch/local_stack/otlp.py) and keeps its last traces for `pdorch trace` (tests/fixtures/traced_stack.py).
One stack for the module; store reads, a failover and a preemption in a trace:
tests/integration/test_traces_workers.py.
"""

from __future__ import annotations

import json

import httpx
import pytest

from pdorch.cli import main as pdorch_main
from pdorch.local_stack.otlp import OtlpReceiver
from pdorch.local_stack.router import cluster_router, wait_until
from pdorch.local_stack.workers import start_cluster
from tests.fixtures.traced_stack import Stack, observability, trace_id_of

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
# One request's spans from the three processes, parent first (the workers add theirs under these).
REQUEST_SPANS = {"router.request", "router.attempt", "decode.generate", "prefill.prefill"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_model_dir):
    otlp = OtlpReceiver().start()
    # max_local_prefill_tokens 0: every request calls the prefill worker (its spans are in every trace)
    cluster = start_cluster(tmp_path_factory.mktemp("tracing"), tiny_model_dir, with_store=True,
                            observability=observability(otlp), decode={"max_local_prefill_tokens": 0})
    with cluster.stopped_on_failure():
        router = cluster_router(cluster, tiny_model_dir)
    yield Stack(cluster, router, otlp)
    router.stop()
    cluster.stop()
    otlp.stop()


def test_one_chat_request_is_one_trace_across_router_decode_and_prefill(stack):
    r = stack.chat("Tell me about the history of the printing press in Europe and its effect on science.")
    trace_id = trace_id_of(r)
    spans = {s.name: s for s in stack.otlp.wait_for(trace_id, REQUEST_SPANS)}
    services = {name: spans[name].service for name in REQUEST_SPANS}
    assert services == {"router.request": "pdorch-router", "router.attempt": "pdorch-router",
                        "decode.generate": "pdorch-decode", "prefill.prefill": "pdorch-prefill"}
    root = spans["router.request"]
    assert root.parent_span_id == ""  # no traceparent from the client: a new trace
    assert spans["router.attempt"].parent_span_id == root.span_id
    assert spans["decode.generate"].parent_span_id == spans["router.attempt"].span_id
    assert spans["prefill.prefill"].parent_span_id == spans["decode.generate"].span_id
    body = r.json()
    attributes = root.attributes
    assert attributes["pdorch.request_id"] == body["id"].removeprefix("chatcmpl-")
    assert attributes["pdorch.finish_reason"] == body["choices"][0]["finish_reason"]
    assert attributes["pdorch.prompt_tokens"] == body["usage"]["prompt_tokens"]
    assert attributes["pdorch.completion_tokens"] == body["usage"]["completion_tokens"]
    assert attributes["http.response.status_code"] == 200 and root.status_code != 2
    assert attributes["pdorch.prefill"] == stack.cluster.prefill.address
    assert attributes["pdorch.decode"] == stack.cluster.decode.address
    assert (attributes["pdorch.retries"], attributes["pdorch.failovers"]) == (0, 0)
    assert spans["router.attempt"].attributes["pdorch.policy"] == stack.router.app.state.service.policy.name
    # each starts after its parent (one clock: every process is on this machine); D's call ends after
    # P's. (D's stream may end a moment after the router answered: its trailers follow the last token.)
    assert root.start_ns <= spans["router.attempt"].start_ns <= spans["decode.generate"].start_ns
    assert spans["decode.generate"].start_ns <= spans["prefill.prefill"].start_ns
    assert spans["prefill.prefill"].end_ns <= spans["decode.generate"].end_ns


def test_a_client_traceparent_is_honoured(stack):
    r = stack.chat("What is a traceparent?", headers={
        "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01", "tracestate": "client=1"})
    assert trace_id_of(r) == CLIENT_TRACE
    spans = {s.name: s for s in stack.otlp.wait_for(CLIENT_TRACE, REQUEST_SPANS)}
    assert spans["router.request"].parent_span_id == CLIENT_SPAN


@pytest.mark.parametrize("bad", ["00-not-a-trace-01", f"00-{'0' * 32}-{CLIENT_SPAN}-01", f"zz-{CLIENT_TRACE}"])
def test_a_malformed_traceparent_is_ignored_and_a_new_trace_starts(stack, bad):
    r = stack.chat("Hello there", headers={"traceparent": bad})
    trace_id = trace_id_of(r)
    assert trace_id not in (CLIENT_TRACE, "0" * 32)
    spans = {s.name: s for s in stack.otlp.wait_for(trace_id, REQUEST_SPANS)}
    assert spans["router.request"].parent_span_id == ""


def test_pdorch_trace_prints_the_waterfall_of_a_just_served_request(stack, capsys):
    r = stack.chat("Name three rivers of Africa and the countries they cross.")
    trace_id, request_id = trace_id_of(r), r.json()["id"]
    # the workers' spans end as their RPCs do, a moment after the client has its answer
    wait_until(lambda: REQUEST_SPANS <= {s["name"] for s in stack.admin_trace(trace_id)["spans"]}, 10,
               "every process's spans in /admin/traces")
    capsys.readouterr()
    assert pdorch_main(["trace", request_id, "--url", stack.router.url]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"trace {trace_id}  request {request_id.removeprefix('chatcmpl-')}")
    rows = [line.split() for line in out[2:]]  # start, duration, service, instance, span, attributes...
    order = [row[4] for row in rows if row[4] in REQUEST_SPANS]
    assert order == ["router.request", "router.attempt", "decode.generate", "prefill.prefill"], "\n".join(out)
    by_name = {row[4]: row for row in rows}
    assert [by_name[n][2] for n in order] == ["router", "router", "decode", "prefill"]  # the process column
    starts = [float(row[0]) for row in rows]
    assert starts == sorted(starts) and starts[0] == 0.0
    assert f"prefill={stack.cluster.prefill.address}" in " ".join(by_name["router.request"])
    # --json: the same spans, as /admin/traces serves them
    assert pdorch_main(["trace", "--trace-id", trace_id, "--url", stack.router.url, "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["trace_id"] == trace_id and body["unreachable"] == {}
    assert {s["service"] for s in body["spans"]} == {"pdorch-router", "pdorch-decode", "pdorch-prefill"}
    # --slowest: the traces the router keeps, the longest first
    assert pdorch_main(["trace", "--slowest", "2", "--url", stack.router.url]) == 0
    assert capsys.readouterr().out.count("\ntrace ") + 1 >= 2


def test_admin_traces_refuses_bad_input(stack):
    for path, param in (("/admin/traces/xyz", "trace_id"), ("/admin/traces?slowest=0", "slowest"),
                        ("/admin/traces", "request_id")):
        r = httpx.get(stack.router.url + path, timeout=10)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (path, r.text)
    r = httpx.get(f"{stack.router.url}/admin/traces?request_id=never-served", timeout=10)
    assert r.status_code == 404 and "keep_traces" in r.json()["error"]["message"]


def test_an_error_sets_the_span_status_with_the_code_the_client_saw(stack):
    r = httpx.post(stack.router.url + "/v1/chat/completions", timeout=30, json={
        "model": "no-such-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 404
    [root] = [s for s in stack.otlp.wait_for(trace_id_of(r), {"router.request"}) if s.name == "router.request"]
    assert root.status_code == 2 and "no-such-model" in root.status_message
    assert root.attributes["http.response.status_code"] == 404
    assert root.attributes["pdorch.error.code"] == r.json()["error"]["code"] == "model_not_found"
