"""The chain index's victim order under churning conversations vs. a fixed set of conversations.

A pure-logic model of the store (a set of keys with a capacity, evicted down to a low watermark
through ChainIndex.victims) driven like the soak and multi-turn benchmarks drive the real cluster:
each turn looks up its conversation's longest cached prefix (touch from the head), then writes the
pages it lacks. The numbers come from the model, not from the code under test's own arithmetic:
a hit is a page found in the model store.
"""

from __future__ import annotations

import math
import random

from store_client.chain_index import ChainIndex

PAGE = 16


class ModelStore:
    def __init__(self, capacity: int, depth_weight_s: float, clock):
        self.capacity, self.keys = capacity, set()
        self.index = ChainIndex(1 << 20, depth_weight_s, clock=clock)

    def turn(self, conv: str, prompt_pages: int) -> int:
        """One request: pages hit from the head, then write-back of the rest. Returns the hits."""
        keys = [f"{conv}:{d}" for d in range(prompt_pages)]
        hit = 0
        while hit < len(keys) and keys[hit] in self.keys:
            hit += 1
        if hit:
            self.index.touch(keys[:hit], lookup=True)
        for depth in range(hit, len(keys)):
            if len(self.keys) + 1 > 0.89 * self.capacity:
                for victim in self.index.victims(len(self.keys) + 1 - math.floor(0.88 * self.capacity)):
                    self.keys.discard(victim)
                    self.index.forget([victim])
            self.keys.add(keys[depth])
            self.index.touch([keys[depth]], first_depth=depth)
        return hit


def churn(depth_weight_s: float, minutes: float = 30.0, seed: int = 0) -> list[float]:
    """The soak's load: 8 conversations of 4 turns (128 + 96 tokens a turn), Poisson 0.3 req/s, a
    conversation starting over with new text after its 4th turn; store 182 pages. Hit rate by sixth."""
    rng, now = random.Random(seed), [0.0]
    store = ModelStore(182, depth_weight_s, clock=lambda: now[0])
    convs = [[f"c{i}", 0] for i in range(8)]
    busy_until, started = [0.0] * 8, 8
    windows = [[0, 0] for _ in range(6)]
    end = minutes * 60
    while now[0] < end:
        now[0] += rng.expovariate(0.3)
        free = [i for i in range(8) if busy_until[i] <= now[0]]
        if not free:
            now[0] = min(busy_until)
            continue
        i = rng.choice(free)
        name, turn = convs[i]
        pages = (128 + turn * 96) // PAGE
        w = windows[min(5, int(6 * now[0] / end))]
        w[0] += store.turn(name, pages) * PAGE
        w[1] += pages * PAGE
        busy_until[i] = now[0] + 8.0
        convs[i] = [name, turn + 1] if turn + 1 < 4 else [f"c{(started := started + 1)}", 0]
    return [hits / total for hits, total in windows]


def cyclic(depth_weight_s: float, seed: int = 0) -> list[float]:
    """The multi-turn benchmark's full preset: 16 conversations resent every round (45 s apart, in
    random order), 6 rounds, 160 new tokens a turn, store of 506 pages (less than the final working
    set). Hit rate per round."""
    rng, now = random.Random(seed), [0.0]
    store = ModelStore(506, depth_weight_s, clock=lambda: now[0])
    rates = []
    for r in range(6):
        hits = total = 0
        for j, i in enumerate(rng.sample(range(16), 16)):
            now[0] = r * 45.0 + j * 45.0 / 16
            pages = (128 + r * 160) // PAGE
            hits += store.turn(f"c{i}", pages + 2) * PAGE  # + the answer's pages (offload)
            total += (pages + 2) * PAGE
        rates.append(hits / total)
    return rates


def test_hit_rate_does_not_decay_under_churning_conversations():
    for seed in range(3):
        rates = churn(60.0, seed=seed)
        # Before stale pages left first, ended conversations' heads filled the store: 0.46 -> 0.29.
        assert min(rates[1:]) >= 0.85 * rates[0], rates
        assert min(rates) >= 0.4, rates


def test_a_fixed_set_of_conversations_still_keeps_every_head():
    # Plain LRU thrashes here (every conversation comes back after the store evicted it): the depth
    # weight keeps heads. Stale detection must not turn this back into LRU.
    weighted, lru = cyclic(60.0), cyclic(0.0)
    assert weighted[3] >= 1.5 * lru[3] and weighted[5] >= 2 * lru[5], (weighted, lru)
