"""A stream preempted on its decode worker for longer than a proxy's idle timeout completes: the
worker's `paused` chunk and the router's keep-alive comments (router.keepalive_s) keep the
connection alive, and the text equals an undisturbed run's (greedy).

Cluster: real mooncake_master, one prefill and one decode worker process (tiny random-weights model),
the router in the test process behind a small TCP proxy that cuts a connection idle (no byte either
way) for IDLE_S, as nginx's proxy_read_timeout (60 s) or a cloud load balancer does. The issue's
90 s pause behind a 60 s timeout is scaled down: keepalive_s 0.2 s, IDLE_S 0.8 s, a pause > IDLE_S.

How the pause is made (decode_node/preemption.py: the latest arrival is preempted, and resumes once
the pool has room for it): a hog H (short prompt, long output) arrives first, the stream S under
test (long prompt, long output) right after; the pool runs dry while both decode, S is preempted and
waits for its ~89 pages until H, which then holds most of the pool, has decoded its ~1300 remaining
tokens alone. The growth reserve is off so that admission lets the pool run dry.
"""

from __future__ import annotations

import json
import selectors
import socket
import threading

import httpx
import pytest

from pdorch.local_stack.router import cluster_router
from pdorch.local_stack.workers import start_cluster, worker_metric

NUM_PAGES = 120  # 1920 tokens of KV on D
HOG = [(i * 37) % 900 + 20 for i in range(40)]
HOG_TOKENS = 1800  # H ends at 1840 tokens: 115 pages
STREAM = [(i * 53 + 11) % 900 + 20 for i in range(960)]
STREAM_TOKENS = 600  # S ends at 1560 tokens: 98 pages; dry at ~460 tokens each, S then holds ~89
KEEPALIVE_S = 0.2
IDLE_S = 0.8


class IdleCuttingProxy:
    """127.0.0.1:<port> -> 127.0.0.1:<target>: a connection with no byte in either direction for
    `idle_s` is closed (both sides); `cut` counts them. One thread per connection, stopped with it."""

    def __init__(self, target_port: int, idle_s: float):
        self.target_port, self.idle_s = target_port, idle_s
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.port = self.server.getsockname()[1]
        self.cut = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._acceptor = threading.Thread(target=self._accept, name="idle-proxy", daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            t = threading.Thread(target=self._relay, args=(client,), name="idle-proxy-conn", daemon=True)
            self._threads.append(t)
            t.start()

    def _relay(self, client: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
        peer = {client: upstream, upstream: client}
        with selectors.DefaultSelector() as sel, client, upstream:
            for s in peer:
                sel.register(s, selectors.EVENT_READ)
            while not self._stop.is_set():
                ready = sel.select(timeout=self.idle_s)
                if not ready:  # idle too long: cut, as a proxy's idle timeout does
                    self.cut += 1
                    return
                for key, _ in ready:
                    data = key.fileobj.recv(65536)
                    if not data:
                        return
                    peer[key.fileobj].sendall(data)

    def stop(self) -> None:
        self._stop.set()
        self.server.close()
        for t in [self._acceptor, *self._threads]:
            t.join(timeout=5)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_model_dir):
    cluster = start_cluster(tmp_path_factory.mktemp("paused"), tiny_model_dir, with_store=True,
                            decode={"num_pages": NUM_PAGES, "growth_reserve": 0.0, "prefix_cache": True,
                                    "offload_generated_kv": True})
    router = proxy = None
    try:
        router = cluster_router(cluster, tiny_model_dir, keepalive_s=KEEPALIVE_S)
        proxy = IdleCuttingProxy(router.port, IDLE_S)
        yield cluster, router, proxy
    finally:
        if proxy is not None:
            proxy.stop()
        if router is not None:
            router.stop()
        cluster.stop()


def body(prompt: list[int], max_tokens: int) -> dict:
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}


def streamed(url: str, prompt: list[int], max_tokens: int, started: threading.Event | None = None) -> tuple[str, dict]:
    """(the text, usage) of a streamed completion read to its [DONE]; `started` is set at its first token."""
    text, usage = [], None
    with httpx.stream("POST", url + "/v1/completions", json=body(prompt, max_tokens),
                      timeout=httpx.Timeout(60, read=60)) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            if chunk.get("usage"):
                usage = chunk["usage"]
            if chunk["choices"]:
                text.append(chunk["choices"][0]["text"])
                if started is not None:
                    started.set()
    return "".join(text), usage


def preempted_behind(url: str) -> tuple[str, dict]:
    """S's (text, usage) while H holds the pool (see the module doc), both through `url`."""
    hog_started, hog = threading.Event(), {}
    t = threading.Thread(target=lambda: hog.update(out=streamed(url, HOG, HOG_TOKENS, hog_started)), daemon=True)
    t.start()
    try:
        assert hog_started.wait(30), "the hog did not start"
        return streamed(url, STREAM, STREAM_TOKENS)  # arrives last: the one preempted
    finally:
        t.join(60)
        assert not t.is_alive(), "the hog did not end"


def test_a_stream_preempted_longer_than_the_proxys_idle_timeout_completes_equal_to_an_undisturbed_run(stack):
    cluster, _, proxy = stack
    url = f"http://127.0.0.1:{proxy.port}"
    alone, usage = streamed(url, STREAM, STREAM_TOKENS)  # undisturbed: the pool holds it with room to spare
    assert usage["preemptions"] == 0 and usage["completion_tokens"] == STREAM_TOKENS
    cluster.wait_idle("decode")
    paused_before = worker_metric(cluster.decode, "pdorch_decode_preempted_seconds_sum")
    text, usage = preempted_behind(url)
    paused = worker_metric(cluster.decode, "pdorch_decode_preempted_seconds_sum") - paused_before
    assert usage["preemptions"] >= 1, usage
    assert paused > IDLE_S, f"the stream paused {paused:.2f} s, not past the proxy's {IDLE_S} s: a test set-up error"
    assert proxy.cut == 0
    assert text == alone  # greedy: the same text as the undisturbed run
    cluster.assert_pools_sound()


def test_without_keepalives_the_proxy_cuts_the_paused_stream(stack, tiny_model_dir):
    """The control: the same pause through a router with router.keepalive_s 0 is cut by the proxy."""
    cluster, _, _ = stack
    router = cluster_router(cluster, tiny_model_dir, keepalive_s=0.0)
    proxy = IdleCuttingProxy(router.port, IDLE_S)
    try:
        with pytest.raises(httpx.RemoteProtocolError):
            preempted_behind(f"http://127.0.0.1:{proxy.port}")
        assert proxy.cut >= 1
    finally:
        proxy.stop()
        router.stop()
    cluster.wait_idle("decode")
    cluster.assert_pools_sound()
