"""Pure routing logic: policies, LRU page index, session affinity, circuit breaker, auth."""

from __future__ import annotations

import pytest

from router.dispatch.policies import CacheAware, LRUSet, RouteContext, SessionAffinity, make_policy
from router.errors import APIError
from router.fleet.circuit import CircuitBreaker
from router.fleet.workers import Worker
from router.http.auth import Auth


def _w(addr: str, load: int = 0) -> Worker:
    w = Worker("prefill", addr, addr, CircuitBreaker(3, 10.0))
    w.in_flight = load
    return w


def test_lru_set_evicts_least_recently_used_and_counts_leading_matches():
    s = LRUSet(3)
    s.touch(["a", "b", "c"])
    s.touch(["a"])  # a is now most recent; b is the oldest
    s.touch(["d"])
    assert "b" not in s and {"a", "c", "d"} <= {k for k in "abcd" if k in s}
    assert len(s) == 3
    assert s.leading_matches(["a", "c", "x", "d"]) == 2
    assert s.leading_matches(["x", "a"]) == 0


def test_round_robin_rotates_over_workers_in_address_order():
    p = make_policy("round_robin", 16, 8)
    ws = [_w("b:1"), _w("a:1"), _w("c:1")]
    picks = [p.choose(ws, RouteContext([])).address for _ in range(6)]
    assert picks == ["a:1", "b:1", "c:1", "a:1", "b:1", "c:1"]


def test_least_load_picks_the_idlest_and_rotates_ties():
    p = make_policy("least_load", 16, 8)
    ws = [_w("a:1", 3), _w("b:1", 1), _w("c:1", 1)]
    picks = {p.choose(ws, RouteContext([])).address for _ in range(4)}
    assert picks == {"b:1", "c:1"}


def test_cache_aware_prefers_longest_prefix_match():
    p = CacheAware(cache_index_pages=100, load_imbalance_threshold=8)
    a, b = _w("a:1"), _w("b:1")
    p.on_routed(a, RouteContext(["h1", "h2", "h3"]))
    p.on_routed(b, RouteContext(["h1", "x2"]))
    assert p.choose([a, b], RouteContext(["h1", "h2", "h3", "h4"])) is a
    assert p.choose([a, b], RouteContext(["h1", "x2", "x3"])) is b
    assert p.matched_pages(a, ["h1", "h2", "zz"]) == 2




def test_cache_aware_threshold_rule_exactly():
    p = CacheAware(cache_index_pages=100, load_imbalance_threshold=2)
    a, b = _w("a:1", load=4), _w("b:1", load=2)
    p.on_routed(a, RouteContext(["h1", "h2"]))
    assert p.choose([a, b], RouteContext(["h1", "h2"])) is a  # 4 - 2 = 2, not more than 2
    a.in_flight = 5
    assert p.choose([a, b], RouteContext(["h1", "h2"])) is b  # 5 - 2 = 3 > 2
    assert p.choose([a, b], RouteContext(["zz"])) is b  # no match: least load


def test_cache_aware_index_is_bounded_and_forgotten_with_the_worker():
    p = CacheAware(cache_index_pages=4, load_imbalance_threshold=8)
    a = _w("a:1")
    p.on_routed(a, RouteContext([f"h{i}" for i in range(10)]))
    assert len(p.index["a:1"]) == 4
    p.forget(a)
    assert "a:1" not in p.index
    p.on_routed(a, RouteContext(["h"]))
    p.reset()
    assert p.index == {}


def test_unknown_policy_names_the_choices():
    with pytest.raises(ValueError, match="cache_aware"):
        make_policy("random", 1, 1)


def test_session_affinity_sticks_while_the_worker_is_there():
    s = SessionAffinity(capacity=2)
    a, b = _w("a:1"), _w("b:1")
    s.remember("u1", a)
    assert s.lookup("u1", [a, b]) is a
    assert s.lookup("u1", [b]) is None  # pinned worker gone
    assert s.lookup("u2", [a, b]) is None


def test_circuit_breaker_opens_half_opens_and_closes():
    cb = CircuitBreaker(failure_threshold=2, cooldown_s=5.0)
    assert cb.allow(0.0)
    cb.record_failure(0.0)
    assert cb.state == "closed" and cb.allow(0.1)
    cb.record_failure(1.0)
    assert cb.state == "open" and not cb.allow(2.0)
    assert cb.allow(6.5) and cb.state == "half_open"
    cb.on_sent()
    assert not cb.allow(6.6)  # one trial at a time
    cb.record_failure(7.0)
    assert cb.state == "open" and not cb.allow(8.0)
    assert cb.allow(12.5)
    cb.record_success()
    assert cb.state == "closed" and cb.failures == 0


def test_auth_client_and_admin_rules():
    open_auth = Auth()
    open_auth.check_client(None)
    open_auth.check_admin(None)
    auth = Auth(api_key="sk-client-7", admin_key="sk-admin-9")
    auth.check_client("Bearer sk-client-7")
    auth.check_client("Bearer sk-admin-9")  # the admin key is also a client key
    auth.check_admin("Bearer sk-admin-9")
    for header, status in [(None, 401), ("Bearer nope", 401), ("Basic sk-client-7", 401)]:
        with pytest.raises(APIError) as e:
            auth.check_client(header)
        assert e.value.status == status
    with pytest.raises(APIError) as e:
        auth.check_admin("Bearer sk-client-7")
    assert e.value.status == 403
    with pytest.raises(APIError) as e:
        auth.check_admin(None)
    assert e.value.status == 401
    assert "sk-client-7" not in repr(auth) and "sk-admin-9" not in repr(auth)
    only_client = Auth(api_key="sk-client-7")
    only_client.check_admin("Bearer sk-client-7")  # no admin key: admin endpoints follow the client rule


def test_store_aware_sends_a_stored_prefix_to_the_least_loaded_worker():
    aware, plain = CacheAware(64, 8, store_index_pages=64), CacheAware(64, 8)
    a, b = _w("a:1"), _w("b:1")
    conv = RouteContext(["h1", "h2", "h3"])
    for p in (aware, plain):
        p.on_routed(a, conv)  # a's L1 (and, store-aware, the store) holds the conversation
    a.in_flight = 2  # a is busier, but within the imbalance threshold
    longer = RouteContext(["h1", "h2", "h3", "h4"])
    assert plain.choose([a, b], longer) is a  # plain cache-aware queues behind a
    assert aware.choose([a, b], longer) is b  # the store serves h1..h3 on b at once
    assert aware.decisions["store_covered"] == 1
    # a prefix the store does not hold as far as a's L1 does: the threshold rule as before
    aware.store_index = LRUSet(64)
    aware.store_index.touch(["h1"])
    assert aware.choose([a, b], longer) is a and aware.decisions["prefix_match"] == 1
    # equal load: the L1 holder wins, the store is not needed
    a.in_flight = 0
    aware.on_routed(a, conv)
    assert aware.choose([a, b], longer) is a
    assert sum(aware.decisions.values()) == 3


def test_make_policy_store_index_only_for_cache_aware():
    assert make_policy("cache_aware", 16, 8, 32).store_index.capacity == 32
    assert make_policy("cache_aware", 16, 8).store_index is None
    assert not hasattr(make_policy("least_load", 16, 8, 32), "store_index")


def test_the_pool_answers_one_cached_list_until_a_worker_changes():
    from router.fleet.workers import WorkerPool

    pool = WorkerPool(failure_threshold=1, cooldown_s=0.0, health_interval_s=1.0)
    ws = [Worker("prefill", f"p{i}:1", f"p{i}", CircuitBreaker(1, 0.0), healthy=True) for i in range(3)]
    for w in ws:
        pool._workers[("prefill", w.address)] = w
    first = pool.routable("prefill")
    assert first == ws and first.steady and pool.routable("prefill") is first
    assert pool.routable("prefill", {ws[0]}) == ws[1:] and not pool.routable("prefill", {ws[0]}).steady
    pool.record_success(ws[0])  # already closed: nothing changed
    assert pool.routable("prefill") is first
    pool.record_failure(ws[1], "boom")  # open; with no cooldown at once on trial
    trial = pool.routable("prefill")
    assert trial == ws and not trial.steady
    ws[1].breaker.on_sent()  # the trial went out: not routable until it reports back
    assert pool.routable("prefill") == [ws[0], ws[2]] and pool.routable("prefill").steady
    pool.record_success(ws[1])
    assert pool.routable("prefill") == ws and pool.routable("prefill").steady
    pool._set_healthy(ws[2], False)
    assert pool.routable("prefill") == ws[:2]


def test_the_pool_keeps_the_smallest_context_until_a_worker_or_its_info_changes():
    import asyncio

    from proto.pdorch.v1 import worker_pb2
    from router.fleet.workers import WorkerPool

    class Stub:  # answers Info with whatever context the test sets
        def __init__(self, tokens: int):
            self.tokens = tokens

        async def Info(self, request, timeout):  # the gRPC method's name
            return worker_pb2.WorkerInfo(role="prefill", max_context_tokens=self.tokens)

    async def scenario():
        pool = WorkerPool(failure_threshold=1, cooldown_s=0.0, health_interval_s=1.0)
        a = Worker("prefill", "a:1", "a", CircuitBreaker(1, 0.0), stub=Stub(4096))
        b = Worker("decode", "b:1", "b", CircuitBreaker(1, 0.0), stub=Stub(0))
        pool._workers.update({("prefill", "a:1"): a, ("decode", "b:1"): b})
        assert pool.context_tokens() == 0  # no Info yet
        await pool.check_all()
        assert pool.context_tokens() == 4096  # b reports none: not a limit
        b.stub.tokens = 2048
        await pool.check(b)
        assert pool.context_tokens() == 2048
        await pool.remove("decode", "b:1")
        assert pool.context_tokens() == 4096

    asyncio.run(scenario())


def test_route_decides_and_records_an_attempt_in_one_call():
    """Policy.route: the pool's candidates (the tried ones left out while others are routable), the
    session's pin, both workers' load counted; the pool tells the policy of every load change, the
    shares sent as the shares ended."""
    from router.dispatch.policies import LeastLoad
    from router.fleet.workers import WorkerPool

    pool = WorkerPool(failure_threshold=1, cooldown_s=0.0, health_interval_s=7.0)
    ps = [Worker("prefill", f"p{i}:1", f"p{i}", CircuitBreaker(1, 0.0), healthy=True) for i in range(2)]
    ds = [Worker("decode", f"d{i}:1", f"d{i}", CircuitBreaker(1, 0.0), healthy=True) for i in range(2)]
    for w in ps + ds:
        pool._workers[(w.role, w.address)] = w
    policy = LeastLoad()
    told: list[str] = []
    pool.on_load.append(lambda w: told.append(w.address))
    first = policy.route(pool, [], "s1", 0, set(), set())
    assert (first.p.in_flight, first.d.in_flight, first.p.routed) == (1, 1, 1) and first.decision == "least_load"
    assert told == [first.p.address, first.d.address]
    again = policy.route(pool, [], "s1", 0, set(), {first.d})  # the session keeps its P; the tried D is left out
    assert again.p is first.p and again.decision == "session" and again.d is not first.d
    assert policy.route(pool, [], None, 0, {ps[0], ps[1]}, set()).p in ps  # all tried: any routable one
    told.clear()
    pool.done(first.p, ok=True)
    assert first.p.in_flight == 1 and told == [first.p.address]  # routed twice, one share ended
    for w in ps:
        pool._set_healthy(w, False)
    with pytest.raises(APIError) as e:
        policy.route(pool, [], None, 0, set(), set())
    assert e.value.status == 503 and "prefill" in e.value.message and e.value.headers == {"Retry-After": "7"}
