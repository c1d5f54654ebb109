"""CacheAware on the KV-event index (router/policies.py + router/kv_index.py + router/kv_choice.py):
what the workers say they hold decides, replicas agree, a stale stream falls back to the guess."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

from router.circuit import CircuitBreaker
from router.kv_choice import ChoiceWeights
from router.kv_index import KVIndex
from router.policies import RouteContext, make_policy
from router.workers import Worker


def _w(addr: str, load: int = 0, role: str = "prefill") -> Worker:
    w = Worker(role, addr, addr, CircuitBreaker(3, 10.0))
    w.in_flight = load
    return w


def _snapshot(l1=(), store=(), epoch="e1", seq=1, free=100, load=0):
    return SimpleNamespace(worker_id="w", epoch=epoch, seq=seq, snapshot=True, l1_stored=list(l1), l1_removed=[],
                           store_written=list(store), store_removed=[], free_pages=free, queued_requests=load,
                           running_requests=0, page_size=16)


def _policy(index: KVIndex):
    return make_policy("cache_aware", 64, 8, 64, index, ChoiceWeights(1.0, 0.5, 8))


HASHES = [f"{i:064x}" for i in range(1, 9)]


def test_the_worker_whose_events_say_it_holds_the_prefix_wins_though_this_router_never_sent_it_there():
    index = KVIndex()
    index.apply("a:1", _snapshot())
    index.apply("b:1", _snapshot(l1=HASHES[:6]))
    for a in ("a:1", "b:1"):
        index.set_live(a, True)
    policy = _policy(index)
    assert policy.choose([_w("a:1"), _w("b:1")], RouteContext(HASHES)).address == "b:1"
    assert policy.decisions["prefix_match"] == 1 and policy.guess_fallbacks == 0


def test_two_replicas_with_the_same_events_make_the_same_choices_whatever_their_worker_order():
    def replica():
        index = KVIndex()
        for a in ("a:1", "b:1", "c:1"):
            index.apply(a, _snapshot())
            index.set_live(a, True)
        return _policy(index)

    one, two = replica(), replica()
    ws = [_w("a:1"), _w("b:1"), _w("c:1")]
    prompts = [[hashlib.sha256(f"{p}/{i}".encode()).hexdigest() for i in range(4)] for p in range(40)]
    first = [one.choose(ws, RouteContext(h)).address for h in prompts]
    second = [two.choose(list(reversed(ws)), RouteContext(h)).address for h in prompts]
    assert first == second
    assert len(set(first)) == 3, "idle workers share new prompts"


def test_a_stale_stream_falls_back_to_the_guess_and_is_counted():
    index = KVIndex()
    index.apply("a:1", _snapshot())
    index.apply("b:1", _snapshot(l1=HASHES))
    index.set_live("a:1", True)  # b's stream is down: what the index says of b may be old
    policy = _policy(index)
    # the guess (empty: this router sent nothing yet) picks the least loaded, not the index's b
    assert policy.choose([_w("a:1"), _w("b:1", load=1)], RouteContext(HASHES)).address == "a:1"
    assert policy.guess_fallbacks == 1 and {k: n for k, n in policy.decisions.items() if n} == {"no_match": 1}


def test_decode_goes_to_the_decode_worker_whose_own_cache_holds_the_prefix():
    index = KVIndex()
    index.apply("d1:1", _snapshot())
    index.apply("d2:1", _snapshot(l1=HASHES[:7]))
    for a in ("d1:1", "d2:1"):
        index.set_live(a, True)
    policy = _policy(index)
    decodes = [_w("d1:1", role="decode"), _w("d2:1", role="decode")]
    assert policy.choose_decode(decodes, RouteContext(HASHES)).address == "d2:1"
    assert policy.decode_decisions == {"prefix_match": 1}
    assert policy.choose_decode(decodes, None).address in ("d1:1", "d2:1")  # no prompt: least load


def test_the_published_load_counts_as_much_as_this_routers_own():
    index = KVIndex()
    index.apply("a:1", _snapshot(l1=HASHES, load=20))  # busy with other routers' requests
    index.apply("b:1", _snapshot())
    for a in ("a:1", "b:1"):
        index.set_live(a, True)
    policy = _policy(index)
    assert policy.choose([_w("a:1"), _w("b:1")], RouteContext(HASHES)).address == "b:1"
    assert policy.decisions["imbalance"] == 1


def test_a_store_clear_drops_the_store_claims_an_l1_flush_keeps_them():
    index = KVIndex()
    index.apply("a:1", _snapshot(store=HASHES))
    policy = _policy(index)
    policy.reset(store=False)
    assert index.store_run(HASHES) == len(HASHES)
    policy.reset(store=True)
    assert index.store_run(HASHES) == 0


def test_repeated_choices_reuse_one_candidate_view_and_see_each_load_change():
    index = KVIndex()
    for a in ("a:1", "b:1"):
        index.apply(a, _snapshot(l1=HASHES[:4]))  # both hold the prefix: load decides
        index.set_live(a, True)
    policy = _policy(index)
    a, b = _w("a:1", load=3), _w("b:1", load=0)
    assert policy.choose([a, b], RouteContext(HASHES)).address == "b:1"
    view = index.view(policy._candidates([a, b]))
    b.in_flight = 5
    assert policy.choose([a, b], RouteContext(HASHES)).address == "a:1"  # the new load, not a cached one
    assert index.view(policy._candidates([a, b])) is view  # the same wrappers: the cached view
    a2 = _w("a:1", load=0)  # a worker re-added under the same address is a new candidate
    assert policy.choose([a2, b], RouteContext(HASHES)) is a2
