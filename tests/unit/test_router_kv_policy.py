"""CacheAware on the KV-event index (router/dispatch/policies.py + router/kv/index.py + router/kv/choice.py):
what the workers say they hold decides, replicas agree, a stale stream falls back to the guess."""

from __future__ import annotations

import hashlib
import random
from types import SimpleNamespace

from router.dispatch.policies import RouteContext, make_policy
from router.fleet.circuit import CircuitBreaker
from router.fleet.workers import RoutableList, Worker
from router.kv.choice import ChoiceWeights
from router.kv.index import KVIndex


def _w(addr: str, load: int = 0, role: str = "prefill") -> Worker:
    w = Worker(role, addr, addr, CircuitBreaker(3, 10.0))
    w.in_flight = load
    return w


def _snapshot(l1=(), store=(), epoch="e1", seq=1, free=100, load=0):
    return SimpleNamespace(worker_id="w", epoch=epoch, seq=seq, snapshot=True, l1_stored=list(l1), l1_removed=[],
                           store_written=list(store), store_removed=[], free_pages=free, queued_requests=load,
                           running_requests=0, page_size=16, inflight_claimed=[], inflight_released=[])


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
    view = index.view(policy._candidates([a, b])[0])
    b.in_flight = 5
    assert policy.choose([a, b], RouteContext(HASHES)).address == "a:1"  # the new load, not a cached one
    assert index.view(policy._candidates([a, b])[0]) is view  # the same wrappers: the cached view
    a2 = _w("a:1", load=0)  # a worker re-added under the same address is a new candidate
    assert policy.choose([a2, b], RouteContext(HASHES)) is a2


def test_the_steady_list_keeps_a_board_that_follows_every_load_and_chooses_as_a_full_pass():
    """The pool's steady list gets a LoadBoard kept by load_changed; the same choices as a plain list,
    whose loads are read from every worker, over random loads, events and prompts."""
    rng = random.Random(7)
    index = KVIndex()
    addrs = [f"10.0.0.{i}:1" for i in range(24)]
    prompts = [[hashlib.sha256(f"{p}/{i}".encode()).hexdigest() for i in range(6)] for p in range(12)]
    for a in addrs:
        index.apply(a, _snapshot(l1=rng.choice(prompts)[:rng.randrange(7)], load=rng.randrange(4)))
        index.set_live(a, True)
    policy = _policy(index)
    ps = RoutableList([_w(a) for a in addrs], steady=True)
    ds = RoutableList([_w(a.replace(":1", ":2"), role="decode") for a in addrs], steady=True)
    seq = dict.fromkeys(addrs, 1)
    for _ in range(400):
        w = rng.choice(ps + ds)
        op = rng.randrange(3)
        if op == 0:  # a request routed to it or done
            w.in_flight = max(0, w.in_flight + rng.choice((-1, 1)))
            w.routed += 1
        elif op == 1 and w.role == "prefill":  # its event batch: a new published load
            seq[w.address] += 1
            delta = SimpleNamespace(**{**vars(_snapshot(load=rng.randrange(6), seq=seq[w.address])), "snapshot": False})
            assert index.apply(w.address, delta) == "applied"
            w.kv_routed_mark = w.routed
        policy.load_changed(w)
        ctx = RouteContext(rng.choice(prompts))
        assert policy.choose(ps, ctx) is policy.choose(list(ps), ctx)
        assert policy.choose_decode(ds, ctx) is policy.choose_decode(list(ds), ctx)
    assert policy._candidates(ps)[1] is not None and policy._candidates(list(ps))[1] is None
