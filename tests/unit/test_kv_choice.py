"""router/kv/choice.py: the routing decision on the precise index."""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from proto.pdorch.v1.worker_pb2 import KVEventBatch
from router.kv.choice import ChoiceWeights, choose_decode, choose_prefill
from router.kv.index import KVIndex


@dataclass(eq=False)
class W:
    address: str
    load: int = 0


def feed(idx: KVIndex, addr: str, l1=(), store=(), free=100, live=True) -> None:
    idx.apply(addr, KVEventBatch(epoch="e", seq=1, snapshot=True, l1_stored=list(l1), store_written=list(store),
                                 free_pages=free))
    idx.set_live(addr, live)


def test_l1_beats_store_beats_nothing():
    idx = KVIndex()
    a, b, c = W("a:1"), W("b:1"), W("c:1")
    feed(idx, "a:1", l1=["h0", "h1"])
    feed(idx, "b:1", l1=["h0", "h1", "h2"])
    feed(idx, "c:1", store=["h0", "h1", "h2", "h3"])
    assert choose_prefill(idx, [a, b, c], ["h0", "h1", "h2", "h3"]) == (b, "prefix_match")
    # the store holds more than b's L1, but 3 pages in L1 + 1 from the store beat reading 4
    assert choose_prefill(idx, [a, c], ["h0", "h1", "h2", "h3"]) == (a, "prefix_match")
    # no L1 run beats reading it all from the store: the least loaded (c: a is busier)
    a.load = 1
    assert choose_prefill(idx, [a, c], ["h0", "h1", "h2", "h3"], ChoiceWeights(l1=1.0, store=1.0)) == (c, "store_covered")
    assert choose_prefill(idx, [a, c], ["zz"]) == (c, "no_match")
    assert choose_prefill(idx, [a, c], []) == (c, "no_prefix")


def test_load_rules_imbalance_and_store_covered():
    idx = KVIndex()
    a, b = W("a:1", load=4), W("b:1", load=2)
    feed(idx, "a:1", l1=["h0", "h1"])
    feed(idx, "b:1")
    w = ChoiceWeights(load_imbalance_threshold=2)
    assert choose_prefill(idx, [a, b], ["h0", "h1"], w) == (a, "prefix_match")  # 4 - 2 = 2: not more
    a.load = 5
    assert choose_prefill(idx, [a, b], ["h0", "h1"], w) == (b, "imbalance")
    a.load = 3
    feed(idx, "b:1", store=["h0", "h1"])  # the store covers a's run: the least loaded at once
    assert choose_prefill(idx, [a, b], ["h0", "h1"], w) == (b, "store_covered")
    assert choose_prefill(idx, [a, b], ["h0", "h1", "h2"], w) == (b, "store_covered")
    feed(idx, "b:1", store=["h0"])  # the store holds less than a's L1: a stays within the threshold
    assert choose_prefill(idx, [a, b], ["h0", "h1"], w) == (a, "prefix_match")


def test_with_store_weighed_as_much_as_l1_the_store_run_decides_the_score():
    idx = KVIndex()
    a, b = W("a:1", load=1), W("b:1")
    feed(idx, "a:1", l1=["h0"], store=["h0", "h1", "h2"])
    feed(idx, "b:1")
    prompt = ["h0", "h1", "h2", "h3"]
    # l1 weighs what store does: a's one L1 page is worth no more than reading it: the least loaded
    assert choose_prefill(idx, [a, b], prompt, ChoiceWeights(l1=0.5, store=0.5)) == (b, "store_covered")
    assert choose_prefill(idx, [a, b], prompt) == (b, "store_covered")  # default weights: the store covers a's run
    feed(idx, "a:1", l1=["h0", "h1"], store=["h0"])  # the store holds less than a's L1 run: a wins either way
    assert choose_prefill(idx, [a, b], prompt, ChoiceWeights(l1=0.5, store=0.5)) == (a, "prefix_match")
    assert choose_prefill(idx, [a, b], prompt) == (a, "prefix_match")


def test_a_stale_best_candidate_is_reported_for_the_fallback():
    idx = KVIndex()
    a, b = W("a:1"), W("b:1")
    feed(idx, "a:1", l1=["h0"])
    feed(idx, "b:1")
    idx.set_live("a:1", False)
    assert choose_prefill(idx, [a, b], ["h0"]) == (a, "stale")
    idx.set_live("a:1", True)
    assert choose_prefill(idx, [a, b], ["h0"]) == (a, "prefix_match")
    idx.apply("a:1", KVEventBatch(epoch="e", seq=5))  # a gap: behind until replayed
    assert choose_prefill(idx, [a, b], ["h0"]) == (a, "stale")


def test_replicas_with_the_same_state_choose_the_same_whatever_their_order():
    rng = random.Random(3)
    addrs = [f"10.0.0.{i}:5000" for i in range(200)]
    batches = []
    for i, addr in enumerate(addrs):
        l1 = ["sys0", "sys1"] + [f"c{i % 50}-{k}" for k in range(rng.randint(0, 6))]
        batches.append((addr, KVEventBatch(epoch="e", seq=1, snapshot=True, l1_stored=l1,
                                           store_written=["sys0", "sys1", "sys2"])))
    r1, r2 = KVIndex(), KVIndex()
    for addr, b in batches:
        r1.apply(addr, b)
    for addr, b in reversed(batches):  # another replica, another arrival order
        r2.apply(addr, b)
    for addr in addrs:
        r1.set_live(addr, True)
        r2.set_live(addr, True)
    loads = {a: rng.randint(0, 3) for a in addrs}
    c1 = [W(a, loads[a]) for a in addrs]
    c2 = [W(a, loads[a]) for a in reversed(addrs)]  # its own discovery order
    prompts = [["sys0", "sys1"] + [f"c{c}-{k}" for k in range(rng.randint(0, 8))] for c in range(60)]
    prompts += [[f"new{i}", "x"] for i in range(40)] + [["sys0", "sys1", "sys2", "other"]] * 3
    chosen = set()
    for p in prompts:
        (w1, why1), (w2, why2) = choose_prefill(r1, c1, p), choose_prefill(r2, c2, p)
        assert (w1.address, why1) == (w2.address, why2)
        chosen.add(w1.address)
    assert len(chosen) > 20  # ties spread over workers by the prompt, not one favourite


def test_ties_among_idle_workers_spread_by_prompt_and_repeat_for_the_same_prompt():
    idx = KVIndex()
    ws = [W(f"w{i}:1") for i in range(100)]
    for w in ws:
        feed(idx, w.address)
    prompts = [[hashlib.sha256(str(i).encode()).hexdigest()] for i in range(200)]  # real page hashes
    picks = [choose_prefill(idx, ws, p)[0].address for p in prompts]
    assert len(set(picks)) > 50
    assert picks == [choose_prefill(idx, ws, p)[0].address for p in prompts]
    ws[0].load = 1  # a busy worker is never the least loaded
    assert ws[0].address not in {choose_prefill(idx, ws, p)[0].address for p in prompts}


def test_decode_prefers_its_own_prefix_cache_with_room_for_the_rest():
    idx = KVIndex()
    d1, d2, d3 = W("d1:1"), W("d2:1"), W("d3:1", load=1)
    feed(idx, "d1:1", l1=["h0", "h1", "h2"], free=0)  # no room for the last page
    feed(idx, "d2:1", l1=["h0"], free=50)
    feed(idx, "d3:1", free=50)
    prompt = ["h0", "h1", "h2", "h3"]
    assert choose_decode(idx, [d1, d2, d3], prompt) == (d2, "prefix_match")
    feed(idx, "d1:1", l1=["h0", "h1", "h2"], free=1)
    assert choose_decode(idx, [d1, d2, d3], prompt) == (d1, "prefix_match")
    assert choose_decode(idx, [d1, d3], ["zz"]) == (d1, "no_match")
    feed(idx, "d1:1", l1=["h0"], free=0)
    feed(idx, "d2:1", l1=["h0"], free=0)
    assert choose_decode(idx, [d1, d2, d3], prompt) == (d1, "no_room")


def test_many_holders_among_candidates_with_higher_slots():
    idx = KVIndex()
    holders = [W(f"h{i}:1", load=1 + i % 3) for i in range(80)]  # slots 0..79 hold the prefix
    others = [W(f"o{i}:1") for i in range(300)]  # slots 80..379, idle, hold nothing
    for w in holders:
        feed(idx, w.address, l1=["p0", "p1"])
    for w in others:
        feed(idx, w.address)
    cands = holders[:70] + others[-5:]
    w, why = choose_prefill(idx, cands, ["p0", "p1", "p2"], ChoiceWeights(load_imbalance_threshold=8))
    assert (w.load, why) == (1, "prefix_match") and w in holders  # the least loaded holder
    w, why = choose_prefill(idx, cands, ["p0", "p1", "p2"], ChoiceWeights(load_imbalance_threshold=0))
    assert (w in others, why) == (True, "imbalance")


def test_a_prefix_in_flight_on_a_worker_routes_there_counted_as_inflight():
    """b claims the prompt's pages (a request there computes them: prefill_node/inflight.py): a request
    sharing them goes to b while its load allows, reason `inflight`; once they are in b's L1 it is an
    ordinary prefix match."""
    idx = KVIndex()
    a, b = W("a:1"), W("b:1", load=1)
    feed(idx, "a:1")
    feed(idx, "b:1")
    idx.apply("b:1", KVEventBatch(epoch="e", seq=2, inflight_claimed=["h0", "h1", "h2"]))
    assert choose_prefill(idx, [a, b], ["h0", "h1", "h2"]) == (b, "inflight")
    b.load = 10  # far busier than a: the imbalance rule as for any prefix
    assert choose_prefill(idx, [a, b], ["h0", "h1", "h2"]) == (a, "imbalance")
    b.load = 1
    idx.apply("b:1", KVEventBatch(epoch="e", seq=3, l1_stored=["h0", "h1", "h2"],
                                  inflight_released=["h0", "h1", "h2"]))
    assert choose_prefill(idx, [a, b], ["h0", "h1", "h2"]) == (b, "prefix_match")
