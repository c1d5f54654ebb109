"""The routing decision on the precise KV index (router/kv/index.py): the router's policy, and
bench/router_overhead/pick.py which times it at fleet scale.

Score of a candidate for a prompt: `l1 * l1_run + store * max(0, store_run - l1_run)`: pages in
its L1 beat pages it would read from the store beat pages it would compute. Load-aware as the
guess-based CacheAware (router/dispatch/policies.py): the best-scoring worker (ties: lower load) wins unless
- its load exceeds the least loaded worker's by more than `load_imbalance_threshold` (`imbalance`);
- or the store holds at least its L1 run: any worker gets the prefix by one store read, so the least
  loaded wins at once (`store_covered`).
A prefill worker's claims (pages a request there computes right now, router/kv/index.py) count as its
L1: a prompt whose matched run ends in a claimed page goes there for the same reasons, counted as
`inflight` (it waits there for the pages: prefill_node/inflight.py).
`stale`: the best candidate's event stream is not live (down, or a gap not yet healed): the index
may be wrong about it, the caller falls back to its guess.

Determinism: router replicas with the same index state and the same loads must choose the same
worker, so ties are broken by the prompt's first page hash against a stable hash of each address
(router/kv/index.py stable_key), never by a counter or by the candidates' order (each replica lists
its workers in its own discovery order).

Loads: each candidate's `.load`, or a LoadBoard (router/kv/loads.py) the caller keeps up to date
(`board`): then the lowest load and the least loaded are found without reading every candidate's
load (at 1,000 workers that read was most of a decision). The board is used only when it holds
exactly the candidates; the choice is the same either way.

Decode: the decode worker whose own prefix cache holds the longest run and has room (free pages)
for the rest of the prompt, load-aware the same way; the store run is the same for every decode
worker (each reads it alike), so it only decides `store_covered`.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from hashlib import blake2b
from operator import add, attrgetter
from typing import TypeVar

from router.kv.candidates import stable_key

Candidate = TypeVar("Candidate")  # what the caller weighs (objects with .address and .load): one of them comes back

REASONS = ("no_prefix", "no_match", "prefix_match", "inflight", "imbalance", "store_covered", "stale", "no_room")

_load = attrgetter("load")


@dataclass(frozen=True)
class ChoiceWeights:
    l1: float = 1.0
    store: float = 0.5
    load_imbalance_threshold: int = 8


def seed_of(hashes: list[str]) -> int:
    """The tie-break seed of a prompt: its first page hash (0 without one)."""
    if not hashes:
        return 0
    try:
        return int(hashes[0][:16], 16)
    except ValueError:  # not a hex page hash (tests, simulations): any stable digest of it
        return int.from_bytes(blake2b(hashes[0].encode(), digest_size=8).digest(), "big")


def pick(tied: list, seed: int):
    """One of a few `tied` workers (distinct addresses), the same for the same set and seed
    whatever their order."""
    if len(tied) == 1:
        return tied[0]
    return min(tied, key=lambda w: stable_key(w.address) ^ seed)


def covering(view, board):
    """`board` if it holds exactly the view's candidates (checked once per view and board version),
    else None: the loads are then read from the candidates."""
    if board is None:
        return None
    tag = (id(board), board.version)
    if view.board_tag != tag:
        view.board_tag = tag
        view.board_covers = len(board) == len(view.by_addr) and all(a in board for a in view.by_addr)
    return board if view.board_covers else None


def least_loaded(view, seed: int, loads: list[int] | None = None, board=None):
    """The least loaded of a CandidateView's workers: among the tied, the first in stable-key order
    at or after the seed (a ring: replicas agree, and prompts spread over idle workers). C loops
    only: one pass over the loads (`loads`: in view.order, if the caller has them), or none with a
    covering `board`."""
    if board is not None:
        return view.by_addr[board.least(seed)]
    if loads is None:
        loads = list(map(_load, view.order))
    low = min(loads)
    start = bisect_left(view.keys, seed)
    try:
        return view.order[loads.index(low, start)]
    except ValueError:
        return view.order[loads.index(low)]


def _least_of(workers: list, seed: int, board=None):
    """least_loaded for a short list (the holders of a prefix)."""
    loads = list(map(_load, workers)) if board is None else board.loads_of([w.address for w in workers])
    low = min(loads)
    return pick([w for w, n in zip(workers, loads) if n == low], seed)


def choose_prefill(index, candidates: list[Candidate], hashes: list[str], weights: ChoiceWeights = ChoiceWeights(),
                   seed: int | None = None, board=None) -> tuple[Candidate, str]:
    """(worker, reason) among `candidates` (objects with .address and .load), for a prompt's page
    hashes. `seed`: the tie-break seed (default: from the first page hash). `board`: the
    candidates' loads (a LoadBoard), if the caller keeps one."""
    seed = seed_of(hashes) if seed is None else seed
    view = index.view(candidates)
    board = covering(view, board)
    if not hashes:
        return least_loaded(view, seed, board=board), "no_prefix"
    run, mask = index.longest_l1(hashes, view)
    top, reason = _decide(index, view, hashes, weights, seed, run, mask, board)
    if reason == "prefix_match" and index.claimed(top.address, hashes[run - 1]):
        reason = "inflight"  # its prefix is being computed there right now: it waits for it there
    return top, reason


def choose_decode(index, candidates: list[Candidate], hashes: list[str], weights: ChoiceWeights = ChoiceWeights(),
                  seed: int | None = None, board=None) -> tuple[Candidate, str]:
    """As choose_prefill, for decode workers: their own prefix caches, and room for the rest of the
    prompt (free pages of their last batch; unknown counts as room)."""
    seed = seed_of(hashes) if seed is None else seed
    view = index.view(candidates)
    board = covering(view, board)
    if not hashes:
        return least_loaded(view, seed, board=board), "no_prefix"
    runs = index.l1_runs(hashes, view)
    if not runs:
        return _decide(index, view, hashes, weights, seed, 0, [], board)
    n = len(hashes)
    roomy = {a: r for a, r in runs.items() if (f := index.free_pages(a)) is None or f >= n - r}
    if not roomy:
        return least_loaded(view, seed, board=board), "no_room"
    run = max(roomy.values())
    return _decide(index, view, hashes, weights, seed, run, [a for a, r in roomy.items() if r == run], board)


_BUSY = 1 << 60  # the load of a non-holder when only holders may win


def _holder_loads(view, mask: int, loads: list[int]) -> list[int]:
    """`loads` (in view.order) with every worker outside `mask` made _BUSY: C loops only."""
    bits = format(mask, "b")[::-1].ljust(max(view.slots, default=0) + 1, "0") + "0"  # slot -1: the last '0'
    penalty = map({"1": 0, "0": _BUSY}.__getitem__, map(bits.__getitem__, view.order_slots))
    return list(map(add, loads, penalty))


def _decide(index, view, hashes, weights, seed, run, holders, board=None):
    """`holders`: a mask of the index's slots, or a list of addresses. `board`: a covering LoadBoard."""
    if not holders:  # nobody's L1 holds its first page: whether the store does names the reason
        return least_loaded(view, seed, board=board), "store_covered" if index.store_run(hashes[:1]) else "no_match"
    store_run = None  # NOTE: read only where it decides: a long prompt's store run is a page walk of its own
    # score(r) is linear on each side of store_run, so the best is at r = 0 or at the longest run; with
    # l1 > store >= 0 an L1 run > 0 beats the store whatever its run (score - floor >= (l1 - store) * run)
    if not (run > 0 and weights.l1 > weights.store >= 0):
        store_run = index.store_run(hashes)
        floor = weights.store * store_run
        score = weights.l1 * run + weights.store * max(0, store_run - run)
        if score <= floor:  # nobody's L1 beats reading the store (or computing)
            return least_loaded(view, seed, board=board), "store_covered" if store_run else "no_match"
    loads = None
    if type(holders) is int:
        if holders == view.mask:  # every candidate holds it: the least loaded
            top = least_loaded(view, seed, board=board)
            return top, "prefix_match" if index.is_live(top.address) else "stale"
        if holders.bit_count() <= 64:
            top = _least_of([view.by_addr[a] for a in index.addresses_of(holders)], seed, board)
        elif board is not None:  # many holders (a widely shared prefix): the board's levels, lowest first
            top = view.by_addr[board.least_among(seed, holders, view.slot_of)]
        else:  # many holders and no board: one pass over every load anyway
            loads = list(map(_load, view.order))
            top = least_loaded(view, seed, _holder_loads(view, holders, loads))
    else:
        top = _least_of([view.by_addr[a] for a in holders], seed, board)
    if not index.is_live(top.address):
        return top, "stale"
    top_load = top.load if board is None else board.load(top.address)
    if top_load == 0:  # nobody is below 0: no need to read every load
        return top, "prefix_match"
    if board is not None:
        low = board.low()
    else:
        loads = loads or list(map(_load, view.order))
        low = min(loads)
    if top_load <= low:
        return top, "prefix_match"
    if (store_run if store_run is not None else index.store_run(hashes[:run])) >= run:
        return least_loaded(view, seed, loads, board), "store_covered"
    if top_load - low > weights.load_imbalance_threshold:
        return least_loaded(view, seed, loads, board), "imbalance"
    return top, "prefix_match"
