"""router/kv/loads.py: the LoadBoard, and kv_choice's decisions on it equal to reading every load."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from proto.pdorch.v1.worker_pb2 import KVEventBatch
from router.kv.candidates import stable_key
from router.kv.choice import ChoiceWeights, choose_decode, choose_prefill, least_loaded
from router.kv.index import KVIndex
from router.kv.loads import LoadBoard


@dataclass(eq=False)
class W:
    address: str
    load: int = 0


def test_least_is_the_ring_successor_of_the_seed_among_the_lowest():
    board = LoadBoard({"a:1": 2, "b:1": 0, "c:1": 0, "d:1": 1})
    assert board.low() == 0
    idle = sorted(("b:1", "c:1"), key=stable_key)
    assert board.least(0) == idle[0]
    assert board.least(stable_key(idle[0]) + 1) == idle[1]
    assert board.least(stable_key(idle[1]) + 1) == idle[0]  # past the last key: the ring wraps
    board.set("b:1", 3)
    board.set("c:1", 3)
    assert (board.low(), board.least(0)) == (1, "d:1")
    v = board.version
    board.set("d:1", 5)  # a load change keeps the version: only membership moves it
    assert board.version == v and board.low() == 2
    board.discard("a:1")
    assert board.version == v + 1 and "a:1" not in board and len(board) == 3 and board.low() == 3


def test_least_among_respects_the_mask():
    board = LoadBoard({"a:1": 0, "b:1": 1, "c:1": 1})
    slot = {"a:1": 0, "b:1": 1, "c:1": 2}
    assert board.least_among(0, 0b001, slot) == "a:1"
    assert board.least_among(0, 0b110, slot) in ("b:1", "c:1")
    assert board.least_among(0, 0b1000, slot) is None


def _random_state(rng: random.Random, n: int):
    idx = KVIndex()
    workers = [W(f"w{i}:1") for i in range(n)]
    prompts = [[f"p{c}-{k}" for k in range(rng.randint(1, 8))] for c in range(30)]
    shared = [f"sys-{k}" for k in range(3)]
    for w in workers:
        l1 = [h for p in rng.sample(prompts, 4) for h in p[:rng.randint(0, len(p))]]
        l1 += shared[:rng.randint(0, 3)] if rng.random() < 0.9 else []  # a prefix most workers hold
        store = [h for p in rng.sample(prompts, 3) for h in p]
        idx.apply(w.address, KVEventBatch(epoch="e", seq=1, snapshot=True, l1_stored=l1, store_written=store,
                                          free_pages=rng.randint(0, 10)))
        idx.set_live(w.address, True)
        w.load = rng.choice((0, 0, 1, 2, 3, 9, 15))
    asks = [rng.choice(prompts) for _ in range(40)] + [shared + rng.choice(prompts) for _ in range(40)]
    return idx, workers, asks


@pytest.mark.parametrize("seed", range(6))
def test_decisions_with_a_board_equal_those_reading_every_load(seed):
    rng = random.Random(seed)
    idx, workers, asks = _random_state(rng, 80)  # > 64 workers: the many-holders path too
    board = LoadBoard({w.address: w.load for w in workers})
    weights = ChoiceWeights(load_imbalance_threshold=rng.choice((2, 8)))
    for hashes in asks:
        assert choose_prefill(idx, workers, hashes, weights, board=board) == choose_prefill(idx, workers, hashes, weights)
        assert choose_decode(idx, workers, hashes, weights, board=board) == choose_decode(idx, workers, hashes, weights)
    w = rng.choice(workers)  # a load change said to the board
    w.load = 0
    board.set(w.address, 0)
    for hashes in asks[:10]:
        assert choose_prefill(idx, workers, hashes, weights, board=board) == choose_prefill(idx, workers, hashes, weights)


def test_a_board_that_does_not_hold_exactly_the_candidates_is_not_used():
    idx = KVIndex()
    a, b = W("a:1", load=5), W("b:1", load=0)
    board = LoadBoard({"a:1": 0, "c:1": 0})  # wrong about a, knows c, not b
    view = idx.view([a, b])
    assert least_loaded(view, 0, board=None) is b
    assert choose_prefill(idx, [a, b], [], board=board) == (b, "no_prefix")
    board.discard("c:1")
    board.set("b:1", 0)
    board.set("a:1", 5)  # now it covers them, with their loads
    assert choose_prefill(idx, [a, b], [], board=board) == (b, "no_prefix")
