"""Prefill/decode selection policies, picked by name from a small registry.

- round_robin: rotate over routable prefill workers.
- least_load:  fewest in-flight requests (ties rotate).
- cache_aware: per prefill worker, a bounded LRU index of the page hashes recently routed to
  it (an approximation of its L1 prefix cache). The worker whose index holds the longest
  leading run of the prompt's page hashes wins, unless its load exceeds the least-loaded
  worker's by more than `load_imbalance_threshold`; then least load wins.
  Store-aware (with the store on): a second index holds the page hashes the store has been sent
  (every routed prompt is written back by its prefill worker). When the store holds at least the
  prefix the best worker's L1 holds, any worker gets that prefix by one batched store read, so a
  busier best worker loses to the least loaded one at once, instead of after the threshold:
  queueing behind a busy worker costs more than a store read.

NOTE: page hashes are chained (hash i covers pages 0..i), so "hash i is in the index" means
the whole prefix up to page i was routed there; the leading run is the matched prefix.
Every choice is counted by reason (`decisions`, exported as pdorch_router_prefill_choices_total).

With KV events (`router.kv_events`, the default): the index is not a guess but what the workers
say their caches and the store hold (router/kv/index.py, fed by router/kv/watch.py), and the choice
is router/kv/choice.py's: a deterministic function of that index and the loads, so router replicas
agree. The guess above is still kept: a worker whose stream is not live (connecting, stale,
refused, or a worker without WatchKV) is routed on it, counted in `guess_fallbacks`. The decode worker is then chosen the same way, on
what its own prefix cache holds (short tails go where they are served locally); without events,
decode is least load. Session affinity (a header value) pins a session to the prefill worker it
first went to while that worker stays routable.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass
from typing import NamedTuple

from router.fleet.workers import RoutableList, Worker, WorkerPool
from router.kv.choice import ChoiceWeights, choose_decode, choose_prefill
from router.kv.index import KVIndex
from router.kv.loads import LoadBoard
from store_client.page_hash import page_hashes


@dataclass
class RouteContext:
    page_hashes: list[str]
    session: str | None = None


class Route(NamedTuple):  # NOTE: made per request: immutable as a frozen dataclass, 3x cheaper to make
    """Where one attempt goes (`Policy.route`): P, D, why P (the policy's reason, or "session"), and
    the prefill workers P was chosen from (a traced request records them)."""

    p: Worker
    d: Worker
    decision: str
    prefills: RoutableList


class LRUSet:
    """Bounded set of keys in least-recently-used order."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._d: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, key: str) -> bool:
        return key in self._d

    def __len__(self) -> int:
        return len(self._d)

    def touch(self, keys: list[str]) -> None:
        d = self._d
        for k in keys:
            if k in d:
                d.move_to_end(k)
            else:
                d[k] = None
        while len(d) > self.capacity:
            d.popitem(last=False)

    def leading_matches(self, keys: list[str]) -> int:
        n = 0
        for k in keys:
            if k not in self._d:
                break
            n += 1
        return n


def _least_loaded(workers: list[Worker], rr: itertools.count) -> Worker:
    low = min(w.load for w in workers)
    tied = [w for w in workers if w.load == low]
    return tied[next(rr) % len(tied)]


class Policy:
    name = ""

    def __init__(self, cache_index_pages: int = 65536, load_imbalance_threshold: int = 8):
        self._rr = itertools.count()
        self._decode_rr = itertools.count()  # NOTE: separate from P's, or P and D rotate in lockstep
        self.affinity = SessionAffinity()

    def route(self, pool: WorkerPool, page_hashes: list[str], session: str | None, kv_tokens: int,
              tried_p: set[Worker], tried_d: set[Worker]) -> Route:
        """One attempt's P and D, decided and recorded in one call: the pool's candidates (those not
        tried yet; 503 without one of each role), P by the session's pin or the policy, D by the
        policy among the decode pools that hold `kv_tokens`; the routing remembered (the index, the
        session's pin) and both workers' load counted (`WorkerPool.sent`, which tells `load_changed`)."""
        prefills, decodes = pool.candidates(tried_p, tried_d, kv_tokens)
        ctx = RouteContext(page_hashes, session)
        p = self.affinity.lookup(session, prefills) if session else None
        decision = "session"
        if p is None:
            p = self.choose(prefills, ctx)
            decision = getattr(self, "last_reason", self.name)
            if session:
                self.affinity.remember(session, p)
        self.on_routed(p, ctx)
        d = self.choose_decode(decodes, ctx)
        pool.sent(p, d)  # the pool tells load_changed (its on_load, router/dispatch/dispatch.py)
        return Route(p, d, decision, prefills)

    def choose(self, workers: list[Worker], ctx: RouteContext) -> Worker:
        raise NotImplementedError

    def prompt_hashes(self, token_ids: list[int], page_size: int) -> list[str]:
        """The prompt's page hashes the policy routes on (RouteContext.page_hashes): none but a
        cache-aware policy's (the others never read them: no hashing on their hot path)."""
        return []

    def on_routed(self, worker: Worker, ctx: RouteContext) -> None:
        pass

    def forget(self, worker: Worker) -> None:
        pass

    def load_changed(self, worker: Worker) -> None:
        """The worker's load moved (a request routed to it or done, a KV event batch from it)."""

    def reset(self, store: bool = False) -> None:
        """Forget learned state (after /flush_cache; `store`: the store was cleared too)."""

    def choose_decode(self, workers: list[Worker], ctx: RouteContext | None = None) -> Worker:
        return _least_loaded(workers, self._decode_rr)


class RoundRobin(Policy):
    name = "round_robin"

    def choose(self, workers, ctx):
        workers = sorted(workers, key=lambda w: w.address)
        return workers[next(self._rr) % len(workers)]


class LeastLoad(Policy):
    name = "least_load"

    def choose(self, workers, ctx):
        return _least_loaded(workers, self._rr)


class CacheAware(Policy):
    name = "cache_aware"
    REASONS = ("no_prefix", "no_match", "prefix_match", "inflight", "imbalance", "store_covered")

    def prompt_hashes(self, token_ids: list[int], page_size: int) -> list[str]:
        return page_hashes(token_ids, page_size)

    def __init__(self, cache_index_pages: int = 65536, load_imbalance_threshold: int = 8,
                 store_index_pages: int = 0, kv_index: KVIndex | None = None,
                 weights: ChoiceWeights | None = None):
        super().__init__()
        self.kv_index = kv_index  # None: KV events off, the guess alone
        self.weights = weights or ChoiceWeights(load_imbalance_threshold=load_imbalance_threshold)
        self.decode_decisions: dict[str, int] = {}
        self.guess_fallbacks = 0  # choices made on the guess because a candidate's stream was not live
        self.capacity = cache_index_pages
        self.threshold = load_imbalance_threshold
        self.index: dict[str, LRUSet] = {}  # worker address -> recently routed page hashes
        # page hashes sent to the store (None: store off or store-aware routing off)
        self.store_index = LRUSet(store_index_pages) if store_index_pages > 0 else None
        self.decisions = dict.fromkeys(self.REASONS, 0)
        self._published: dict[str, _Published] = {}  # address -> its wrapper for the KV choice
        self._steady: dict[str, _Steady] = {}  # role -> its steady routable list, wrappers and loads
        # NOTE: a load change only marks its worker (a C call, no Python frame: four per request, P and D
        # sent and done); the next decision moves the marked workers on the boards (`_settle`), once
        # each however often it moved since. The boards then hold every load a decision reads.
        self._moved: set[Worker] = set()
        self.load_changed = self._moved.add  # type: ignore[method-assign, assignment]

    def matched_pages(self, worker: Worker, hashes: list[str]) -> int:
        idx = self.index.get(worker.address)
        return idx.leading_matches(hashes) if idx is not None else 0

    def choose(self, workers, ctx):
        kv, reason = self.kv_index, "stale"
        if kv is not None and ctx.page_hashes:
            candidates, board = self._candidates(workers)
            chosen, reason = choose_prefill(kv, candidates, ctx.page_hashes, self.weights, board=board)
        if reason == "stale":  # events off, or the chosen worker's stream is not live: the guess decides
            worker, reason = self._choose(workers, ctx)
            self.guess_fallbacks += kv is not None and bool(ctx.page_hashes)
        else:
            worker = chosen.worker
        self.decisions[reason] = self.decisions.get(reason, 0) + 1
        self.last_reason = reason  # a traced request's decision (router/dispatch/request_trace.py)
        return worker

    def choose_decode(self, workers, ctx=None):
        kv = self.kv_index
        if kv is None or ctx is None or not ctx.page_hashes:
            return _least_loaded(workers, self._decode_rr)
        candidates, board = self._candidates(workers)
        chosen, reason = choose_decode(kv, candidates, ctx.page_hashes, self.weights, board=board)
        if reason == "stale":
            return _least_loaded(workers, self._decode_rr)
        self.decode_decisions[reason] = self.decode_decisions.get(reason, 0) + 1
        return chosen.worker

    def _candidates(self, workers: list[Worker]) -> tuple[list[_Published], LoadBoard | None]:
        """The workers as the KV choice sees them, and a LoadBoard of their loads where one is kept.
        NOTE: the pool's steady routable list (router/fleet/workers.py RoutableList) is the same object
        until a worker joins, leaves or changes health: its wrappers and board are built once and the
        board follows the load changes (`load_changed` marks, `_settle` moves them here first), so a
        decision reads no worker it does not weigh. Any other list (a retry without the workers already
        tried, a circuit on trial) gets its wrappers' loads refreshed here, one pass."""
        kv = self.kv_index
        if self._moved:
            self._settle()
        if getattr(workers, "steady", False) and workers:
            st = self._steady.get(workers[0].role)
            if st is None or st.workers is not workers:
                pubs = [self._wrapper(w, len(workers)).refresh(kv) for w in workers]
                st = self._steady[workers[0].role] = _Steady(workers, pubs, LoadBoard({p.address: p.load for p in pubs}))
            return st.pubs, st.board
        return [self._wrapper(w, len(workers)).refresh(kv) for w in workers], None

    def _wrapper(self, w: Worker, n: int) -> _Published:
        """The same wrapper per worker call after call: the index caches its view of a list of the
        same objects (sorted by stable key); new wrappers per request rebuilt it every time."""
        pubs = self._published
        p = pubs.get(w.address)
        if p is None or p.worker is not w:  # new, or a worker re-added under the same address
            if len(pubs) > 4 * n + 64:  # workers come and go: drop the departed ones
                pubs.clear()
            p = pubs[w.address] = _Published(w)
        return p

    def _settle(self) -> None:
        """The loads of the workers whose load moved since the last decision, onto their role's board."""
        kv, steady = self.kv_index, self._steady
        for worker in self._moved:
            st = steady.get(worker.role)
            if st is not None and worker.address in st.board:
                st.board.set(worker.address, _choice_load(worker, kv))
        self._moved.clear()

    def _choose(self, workers, ctx) -> tuple[Worker, str]:
        least = _least_loaded(workers, self._rr)
        if not ctx.page_hashes:
            return least, "no_prefix"
        scored = [(self.matched_pages(w, ctx.page_hashes), -w.load, w) for w in workers]
        best_match = max(s[0] for s in scored)
        if best_match == 0:
            return least, "no_match"
        best = max((s for s in scored if s[0] == best_match), key=lambda s: s[1])[2]
        if best.load <= least.load:
            return best, "prefix_match"
        if self.store_index is not None and self.store_index.leading_matches(ctx.page_hashes) >= best_match:
            return least, "store_covered"
        if best.load - least.load > self.threshold:
            return least, "imbalance"
        return best, "prefix_match"

    def on_routed(self, worker, ctx):
        if ctx.page_hashes and self.kv_index is not None:  # counted as its L1 until its events say so
            self.kv_index.speculate(worker.address, ctx.page_hashes)
        if ctx.page_hashes:
            self.index.setdefault(worker.address, LRUSet(self.capacity)).touch(ctx.page_hashes)
            if self.store_index is not None:  # its prefill worker writes the prompt's pages back
                self.store_index.touch(ctx.page_hashes)

    def forget(self, worker):
        self.index.pop(worker.address, None)

    def reset(self, store: bool = False):
        """After /flush_cache: the guess is forgotten. The KV index learns the L1 flushes from the
        workers' events; a store clear (`?store=true`, a child process) no worker sees: its claims go here."""
        if store and self.kv_index is not None:
            self.kv_index.clear_store()
        self.index.clear()
        if self.store_index is not None:
            self.store_index = LRUSet(self.store_index.capacity)


def _choice_load(worker: Worker, kv: KVIndex | None) -> int:
    published = kv.load(worker.address) if kv is not None else None
    if published is None:
        return worker.in_flight
    return max(worker.in_flight, published + worker.routed - worker.kv_routed_mark)


@dataclass(frozen=True)
class _Steady:
    """A role's steady routable list, its wrappers, and their loads kept on a board."""

    workers: list[Worker]
    pubs: list
    board: LoadBoard


class _Published:
    """A worker as the KV-event choice sees it: its load is the queued + running requests the worker
    itself last published (what every replica sees) plus what this router sent it since that batch,
    at least this router's own requests in flight.
    NOTE: the published number alone is ~50 ms old: replicas then all pile onto the same idle worker
    (the fleet simulation, since removed (docs/benchmarks.md), measured 5 % of the oracle's hit rate lost to it at 50 workers)."""

    __slots__ = ("address", "load", "worker")

    def __init__(self, worker: Worker):
        self.worker, self.address, self.load = worker, worker.address, 0

    def refresh(self, kv: KVIndex | None) -> _Published:
        self.load = _choice_load(self.worker, kv)
        return self


POLICIES: dict[str, type[Policy]] = {p.name: p for p in (RoundRobin, LeastLoad, CacheAware)}


def make_policy(name: str, cache_index_pages: int, load_imbalance_threshold: int,
                store_index_pages: int = 0, kv_index: KVIndex | None = None,
                weights: ChoiceWeights | None = None) -> Policy:
    """`store_index_pages` > 0: cache_aware also remembers that many page hashes sent to the store.
    `kv_index`: cache_aware routes on the workers' KV events (the guess only for stale workers)."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"router.policy: unknown policy {name!r}; choose one of {sorted(POLICIES)}") from None
    if cls is CacheAware:
        return CacheAware(cache_index_pages, load_imbalance_threshold, store_index_pages, kv_index, weights)
    return cls(cache_index_pages=cache_index_pages, load_imbalance_threshold=load_imbalance_threshold)


class SessionAffinity:
    """Bounded map session key -> prefill worker address."""

    def __init__(self, capacity: int = 65536):
        self._m = LRUSet(capacity)
        self._addr: dict[str, str] = {}

    def lookup(self, session: str, workers: list[Worker]) -> Worker | None:
        addr = self._addr.get(session)
        if addr is None:
            return None
        for w in workers:
            if w.address == addr:
                return w
        return None

    def remember(self, session: str, worker: Worker) -> None:
        self._m.touch([session])
        self._addr[session] = worker.address
        if len(self._addr) > self._m.capacity:
            self._addr = {k: v for k, v in self._addr.items() if k in self._m}
