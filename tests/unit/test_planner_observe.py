"""Exposition text -> deltas -> an Observation (expected values by hand), and the scrape over real HTTP."""

import http.server
import threading
from typing import ClassVar

import pytest

from pdorch.planner.observe import MetricsObserver
from pdorch.planner.prom_text import counter_deltas, histogram_quantile, parse_samples


def router_text(requests, health, prompt, completion, device, store, buckets, in_flight):
    b = dict(zip(("0.1", "0.5", "1.0", "+Inf"), buckets))
    lines = [f'pdorch_router_requests_total{{route="/v1/chat/completions",status="200"}} {requests}',
             f'pdorch_router_requests_total{{route="/health",status="200"}} {health}',
             f"pdorch_router_prompt_tokens_total {prompt}", f"pdorch_router_completion_tokens_total {completion}",
             f'pdorch_router_cached_tokens_total{{tier="device"}} {device}',
             f'pdorch_router_cached_tokens_total{{tier="store"}} {store}',
             *(f'pdorch_router_ttft_seconds_bucket{{le="{le}",route="/v1/chat/completions"}} {n}' for le, n in b.items()),
             f'pdorch_router_ttft_seconds_count{{route="/v1/chat/completions"}} {buckets[-1]}',
             'pdorch_router_ttft_seconds_sum{route="/v1/chat/completions"} 1.0',
             f"pdorch_router_requests_in_flight {in_flight}"]
    types = ("# TYPE pdorch_router_requests counter\n# TYPE pdorch_router_prompt_tokens counter\n"
             "# TYPE pdorch_router_completion_tokens counter\n# TYPE pdorch_router_cached_tokens counter\n"
             "# TYPE pdorch_router_ttft_seconds histogram\n# TYPE pdorch_router_requests_in_flight gauge\n")
    return types + "\n".join(lines) + "\n"


BEFORE = router_text(10, 5, 1000, 500, 100, 0, (5, 10, 10, 10), 0)
AFTER = router_text(30, 50, 5000, 2500, 1100, 1000, (5, 22, 30, 30), 3)
WORKER_A = "# TYPE pdorch_decode_queue_depth gauge\npdorch_decode_queue_depth 2\n" \
           "# TYPE pdorch_decode_pool_usage_ratio gauge\npdorch_decode_pool_usage_ratio 0.4\n"
WORKER_B = "# TYPE pdorch_decode_queue_depth gauge\npdorch_decode_queue_depth 1\n" \
           "# TYPE pdorch_decode_pool_usage_ratio gauge\npdorch_decode_pool_usage_ratio 0.7\n"


def test_histogram_quantile_interpolates_within_the_bucket():
    deltas = counter_deltas(parse_samples(BEFORE), parse_samples(AFTER))
    # bucket deltas: <=0.1: 0, <=0.5: 12, <=1.0: 20; rank 0.9 x 20 = 18 -> 0.5 + 0.5 x (18 - 12) / 8
    assert histogram_quantile(0.9, deltas, "pdorch_router_ttft_seconds") == pytest.approx(0.875)
    assert histogram_quantile(0.9, {}, "pdorch_router_ttft_seconds") is None


def test_a_counter_that_went_down_was_reset():
    deltas = counter_deltas(parse_samples(AFTER), parse_samples(BEFORE))
    assert deltas[("pdorch_router_prompt_tokens_total", ())] == 1000  # the new value, not -4000


class Scripted:
    """A fetch that returns each URL's next canned text (a fake of the HTTP GET only)."""

    def __init__(self, texts):
        self.texts = {url: list(t) for url, t in texts.items()}

    def __call__(self, url, timeout_s, bearer):
        item = self.texts[url].pop(0)
        if isinstance(item, Exception):
            raise item
        return item


def test_two_scrapes_make_an_observation():
    clock = iter([0.0, 0.0, 0.0, 10.0, 10.0, 10.0])
    fetch = Scripted({"http://r/metrics": [BEFORE, AFTER], "http://a/metrics": [WORKER_A, WORKER_A],
                      "http://b/metrics": [WORKER_B, WORKER_B]})
    observer = MetricsObserver(["http://r"], ["http://a", "http://b/metrics"], 1.0, clock=lambda: next(clock),
                               fetch=fetch)
    assert observer.observe() is None  # the first scrape only primes
    obs = observer.observe()
    assert obs.interval_s == 10.0 and obs.requests == 20  # /health is not a generation route
    assert obs.request_rate == 2.0
    load = obs.load()
    assert (load.mean_prompt_tokens, load.mean_output_tokens) == (200.0, 100.0)
    assert obs.hit_rate == pytest.approx(0.5) and load.uncached_fraction == pytest.approx(0.5)
    assert obs.cached_tokens_by_tier["device"] == 1000 and obs.cached_tokens_by_tier["store"] == 1000
    assert obs.ttft_p90_s == pytest.approx(0.875) and obs.itl_p90_s is None
    assert obs.in_flight == 3 and obs.queue_depth == {"decode": 3} and obs.pool_usage == {"decode": 0.7}


def test_a_router_that_does_not_answer_is_left_out_then_compared_with_its_last_good_scrape():
    clock = iter([0.0, 5.0, 10.0])
    fetch = Scripted({"http://r/metrics": [BEFORE, OSError("connection refused"), AFTER]})
    observer = MetricsObserver(["http://r"], [], 1.0, clock=lambda: next(clock), fetch=fetch)
    assert observer.observe() is None
    assert observer.observe() is None  # no router answered: no observation
    obs = observer.observe()
    assert obs.requests == 20 and obs.interval_s == 10.0  # since the last good scrape, nothing counted twice


class _Handler(http.server.BaseHTTPRequestHandler):
    texts: ClassVar[list] = []

    def do_GET(self):
        body = (self.texts.pop(0) if self.path == "/metrics" else "").encode()
        self.send_response(200 if body else 404)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_scrapes_over_real_http_with_a_deadline():
    _Handler.texts = [BEFORE, AFTER]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        closed = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        dead = f"http://127.0.0.1:{closed.server_address[1]}"
        closed.server_close()  # nothing listens there any more
        observer = MetricsObserver([url], [dead], timeout_s=2.0)
        assert observer.observe() is None
        obs = observer.observe()
        assert obs.requests == 20 and obs.prompt_tokens == 4000
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_the_mean_prompt_is_per_first_token_the_mean_output_per_ended_request():
    from pdorch.planner.observation import Observation
    # 4 long streams got their first token (their 8-token prompts counted then); 1 ended, with 600 tokens
    load = Observation(interval_s=2.0, requests=1, prompt_tokens=32, output_tokens=600, first_tokens=4).load()
    assert (load.mean_prompt_tokens, load.mean_output_tokens) == (8.0, 600.0)
    # first tokens not known (the simulated fleet of bench/autoscale): per ended request
    assert Observation(interval_s=2.0, requests=4, prompt_tokens=32, output_tokens=600).load().mean_prompt_tokens == 8
