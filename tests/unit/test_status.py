"""pdorch status: hit rates per tier from the router's counters, worker table from /workers."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest

from pdorch.status import render_status, token_counters


def metrics_text() -> str:
    r = CollectorRegistry()
    Counter("pdorch_router_prompt_tokens", "p", registry=r).inc(200)
    Counter("pdorch_router_completion_tokens", "c", registry=r).inc(50)
    cached = Counter("pdorch_router_cached_tokens", "c", ["tier"], registry=r)
    cached.labels("device").inc(96)
    cached.labels("store").inc(32)
    cached.labels("ssd").inc(20)
    return generate_latest(r).decode()


def test_token_counters_sum_the_router_counters():
    assert token_counters(metrics_text()) == {"prompt": 200.0, "completion": 50.0, "cached_device": 96.0,
                                              "cached_store": 32.0, "cached_ssd": 20.0}


def test_render_shows_workers_load_and_hit_rates():
    workers = [{"role": "prefill", "address": "127.0.0.1:50161", "healthy": True, "circuit": "closed",
                "in_flight": 2, "routed": 7, "errors": 0,
                "info": {"free_pages": 500, "total_pages": 512, "queued_requests": 1, "running_requests": 2}},
               {"role": "decode", "address": "127.0.0.1:50171", "healthy": False, "info": None},
               {"role": "decode", "address": "127.0.0.1:50172", "healthy": True, "circuit": "closed",
                "in_flight": 3, "routed": 9, "errors": 0,
                "info": {"free_pages": 0, "total_pages": 96, "queued_requests": 2, "running_requests": 3,
                         "preemptions": 12, "preempted_requests": 2, "tp_size": 2}}]
    text = render_status({"url": "http://r", "workers": workers, "tokens": token_counters(metrics_text())})
    lines = text.splitlines()
    assert lines[0] == "router http://r: 3 workers"
    assert lines[3].split() == ["decode", "127.0.0.1:50171", "-", "DOWN", "-", "-", "-", "-", "-", "-", "-", "-",
                                "-"]
    # 12 preemptions since it started, 2 requests waiting to resume now
    # a decode worker of two tensor-parallel ranks
    assert lines[4].split() == ["decode", "127.0.0.1:50172", "2", "ok", "closed", "3", "9", "0", "2", "3", "0/96",
                                "12", "(2", "paused)", "-"]
    assert lines[5].split() == ["prefill", "127.0.0.1:50161", "-", "ok", "closed", "2", "7", "0", "1", "2", "500/512",
                                "-", "-"]
    assert "cache hit rate 74.0% (device 48.0%, host 0.0%, store 16.0%, ssd 10.0%, inflight 0.0%)" in text


def test_render_without_requests():
    text = render_status({"url": "http://r", "workers": [], "tokens": {}})
    assert "cache hit rate: no requests yet" in text


def test_render_shows_the_store_and_the_masters_own_evictions():
    store = {"url": "http://m/metrics", "eviction": "chain", "fill_ratio": 0.84, "keys": 412,
             "capacity_bytes": 512 * 2**20, "master_eviction": {"evicted_keys": 0, "put_no_space": 3}}
    text = render_status({"url": "http://r", "workers": [], "tokens": {}, "store": store})
    assert "store: eviction chain, 84.0% of 512 MiB used, 412 keys" in text
    assert "mooncake_master's own eviction: evicted_keys 0, put_no_space 3" in text
    assert render_status({"url": "http://r", "workers": [], "tokens": {}, "store": None}).endswith("store: off")


def test_pdorch_evictions_are_shown_beside_the_masters():
    from pdorch.status import add_pdorch_evictions

    store = {"url": "http://m/metrics", "eviction": "chain", "master_eviction": {"evicted_keys": 2}}
    workers = [{"role": "prefill", "info": {"store_evicted_pages": 30}},
               {"role": "decode", "info": {"store_evicted_pages": 12}},
               {"role": "decode", "info": {"store_evicted_pages": 5}}, {"role": "decode", "info": None}]
    status = {"url": "http://r", "workers": workers, "tokens": {}, "store": store}
    add_pdorch_evictions(status)
    assert store["pdorch_evicted_pages"] == 47
    text = render_status(status)
    assert "mooncake_master's own eviction: evicted_keys 2" in text
    assert "pdorch's chain eviction: 47 pages removed (decode 17, prefill 30)" in text


def test_the_ssd_tier_is_read_from_the_masters_gauges_and_shown():
    from pdorch.status import ssd_usage

    text = ("# TYPE file_cache_nums_ gauge\nfile_cache_nums_ 96\n# TYPE master_allocated_file_size_bytes gauge\n"
            "master_allocated_file_size_bytes 25165824\n# TYPE master_total_file_capacity_bytes gauge\n"
            "master_total_file_capacity_bytes 2147483648\n# TYPE master_key_count gauge\nmaster_key_count 3\n")
    ssd = ssd_usage(text)
    assert ssd == {"objects": 96.0, "bytes": 25165824.0, "capacity_bytes": 2147483648.0}
    store = {"url": "http://m/metrics", "eviction": "chain", "master_eviction": {}, "ssd": ssd}
    text = render_status({"url": "http://r", "workers": [], "tokens": {}, "store": store})
    assert "ssd tier: 96 objects, 24 MiB on disk (capacity 2 GiB, not enforced by Mooncake)" in text


def test_render_shows_each_workers_kv_event_stream():
    from pdorch.status import render_status

    stream = {"state": "live", "received": 9, "applied": 9, "snapshots": 1, "resyncs": 2, "disconnects": 0,
              "last_error": ""}
    text = render_status({"url": "http://r", "tokens": {}, "workers": [
        {"role": "prefill", "address": "a:1", "healthy": True, "kv_events": stream}]})
    assert "live (9 applied, 2 resyncs)" in text.splitlines()[3]
