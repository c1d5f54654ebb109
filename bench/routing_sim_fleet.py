"""The simulated fleet of bench/routing_sim.py: the workload, the prefill workers (L1 LRU, a shared
store LRU, FIFO service, a KV event journal cut every batch window) and the routers under test.

Simulated time; nothing sleeps. One request = one turn of a conversation: its prompt is the
conversation's previous prompt plus a few new pages, behind one of a few shared system prompts.
"""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from proto.pdorch.v1.worker_pb2 import KVEventBatch
from router.kv.choice import ChoiceWeights, choose_prefill
from router.kv.index import KVIndex
from router.kv.loads import LoadBoard
from router.policies import CacheAware, RouteContext

_K = 0x9E3779B97F4A7C15F39CC0605CEDC8341082276BF3A27251F86C6A11D0C18E95  # odd: a bijection mod 2^256
_MASK = (1 << 256) - 1


def page_hash(owner: int, i: int) -> str:
    """A 64-hex-digit page hash, unique per (owner, page): a conversation's page i names its prefix."""
    return f"{((owner << 8 | i) * _K) & _MASK:064x}"


@dataclass(frozen=True)
class SimConfig:
    workers: int = 1000
    routers: int = 16
    conversations: int = 100_000
    seed: int = 0
    l1_pages: int = 512  # per worker
    store_pages: int = 300_000  # shared
    rate_per_worker: float = 20.0  # requests/s
    think_s: float = 2.0  # mean gap between a conversation's turns
    zipf_a: float = 2.0  # turns per conversation ~ Zipf(a), capped (mean ~1.9 turns)
    max_turns: int = 10
    sys_prompts: int = 8
    sys_pages: int = 2
    first_pages: tuple[int, int] = (4, 24)  # the first turn's own pages (uniform, inclusive)
    extend_pages: tuple[int, int] = (1, 4)  # each later turn adds this many
    max_pages: int = 64
    batch_ms: float = 50.0  # the journal's batch window
    delay_ms: float = 5.0  # event delivery delay (router r gets it delay_ms * (1 + r / routers) after the cut)
    restarts: int = 20
    speculative_ttl_s: float = 5.0
    load_imbalance_threshold: int = 8
    service_ms: tuple[float, float, float] = (2.0, 0.5, 0.05)  # per request, per computed page, per store page


@dataclass(frozen=True)
class Request:
    t: float
    conv: int
    pages: int
    last: bool  # the conversation's last turn: its hashes can go


def make_requests(cfg: SimConfig) -> list[Request]:
    rng = np.random.default_rng(cfg.seed)
    turns = np.minimum(rng.zipf(cfg.zipf_a, cfg.conversations), cfg.max_turns)
    duration = turns.sum() / (cfg.rate_per_worker * cfg.workers)
    starts = rng.uniform(0, duration, cfg.conversations)
    firsts = rng.integers(cfg.first_pages[0], cfg.first_pages[1] + 1, cfg.conversations)
    out = []
    for c in range(cfg.conversations):
        t, pages = float(starts[c]), cfg.sys_pages + int(firsts[c])
        n = int(turns[c])
        gaps = rng.exponential(cfg.think_s, n)
        adds = rng.integers(cfg.extend_pages[0], cfg.extend_pages[1] + 1, n)
        for k in range(n):
            last = k == n - 1 or pages + adds[k] > cfg.max_pages
            out.append(Request(t, c, pages, last))
            if last:
                break
            t += float(gaps[k])
            pages += int(adds[k])
    out.sort(key=lambda r: r.t)
    return out


class Prompts:
    """Each live conversation's page hashes (the system prompt's, then its own), extended per turn."""

    def __init__(self, cfg: SimConfig):
        self.cfg = cfg
        self._h: dict[int, list[str]] = {}
        self.sys_seen: set[int] = set()
        self.computed: dict[int, int] = {}  # conv -> pages some earlier turn computed

    def hashes(self, conv: int, pages: int) -> list[str]:
        h = self._h.get(conv)
        cfg = self.cfg
        if h is None:
            s = conv % cfg.sys_prompts
            h = self._h[conv] = [page_hash(cfg.conversations + s, i) for i in range(cfg.sys_pages)]
        while len(h) < pages:
            h.append(page_hash(conv, len(h)))
        return h[:pages]

    def reusable(self, conv: int) -> int:
        """Pages of this turn an earlier request computed (the ideal hit)."""
        if conv in self.computed:
            return self.computed[conv]
        return self.cfg.sys_pages if conv % self.cfg.sys_prompts in self.sys_seen else 0

    def done(self, req: Request) -> None:
        self.sys_seen.add(req.conv % self.cfg.sys_prompts)
        if req.last:
            self._h.pop(req.conv, None)
            self.computed.pop(req.conv, None)
        else:
            self.computed[req.conv] = req.pages


class Worker:
    """One simulated prefill worker: its L1 (LRU, leaves first: a prompt's deepest pages are the
    least recently used), FIFO service, and its journal (the net change of each hash per window)."""

    def __init__(self, address: str):
        self.address = address
        self.l1: OrderedDict[str, None] = OrderedDict()
        self.epoch, self.seq = f"{address}#0", 0
        self.restarts = 0
        self.pend_l1: dict[str, bool] = {}
        self.pend_store: dict[str, bool] = {}
        self.load = 0
        self.busy_until = 0.0
        self.dirty = False
        self.written: set[str] = set()  # store pages it wrote (for its snapshot at the end)

    def restart(self) -> None:
        self.restarts += 1
        self.l1.clear()
        self.pend_l1.clear()
        self.pend_store.clear()
        self.written.clear()
        self.epoch, self.seq = f"{self.address}#{self.restarts}", 0

    def take(self) -> tuple[list, list, list, list]:
        l1, st = self.pend_l1, self.pend_store
        out = ([h for h, v in l1.items() if v], [h for h, v in l1.items() if not v],
               [h for h, v in st.items() if v], [h for h, v in st.items() if not v])
        self.pend_l1, self.pend_store, self.dirty = {}, {}, False
        return out


class Fleet:
    def __init__(self, cfg: SimConfig):
        self.cfg = cfg
        self.workers = [Worker(f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}:30001") for i in range(cfg.workers)]
        self.store: OrderedDict[str, None] = OrderedDict()
        self._finish: list[tuple[float, int]] = []  # (finish time, worker index)

    def complete_until(self, t: float) -> None:
        fin, ws = self._finish, self.workers
        while fin and fin[0][0] <= t:
            _, i = heapq.heappop(fin)
            w = ws[i]
            w.load -= 1
            w.dirty = True

    def serve(self, i: int, hashes: list[str], t: float) -> tuple[int, int]:
        """Run one prefill on worker i: (pages from its L1, pages from the store)."""
        cfg, w, store = self.cfg, self.workers[i], self.store
        l1 = w.l1
        run = 0
        for h in hashes:
            if h not in l1:
                break
            run += 1
        srun = run
        for h in hashes[run:]:
            if h not in store:
                break
            srun += 1
        pend, spend = w.pend_l1, w.pend_store
        for h in reversed(hashes):  # the deepest page first: page 0 ends most recent
            if h in l1:
                l1.move_to_end(h)
            else:
                l1[h] = None
                pend[h] = True
            if h in store:
                store.move_to_end(h)
            else:
                store[h] = None
                spend[h] = True
                w.written.add(h)
        while len(l1) > cfg.l1_pages:
            pend[l1.popitem(last=False)[0]] = False
        while len(store) > cfg.store_pages:  # this writer's chain evictor makes room
            spend[store.popitem(last=False)[0]] = False
        base, per_computed, per_loaded = cfg.service_ms
        dur = (base + per_computed * (len(hashes) - srun) + per_loaded * (srun - run)) / 1000
        start = max(t, w.busy_until)
        w.busy_until = start + dur
        heapq.heappush(self._finish, (w.busy_until, i))
        w.load += 1
        w.dirty = True
        return run, srun - run

    def _load(self, w: Worker) -> dict:
        return {"free_pages": self.cfg.l1_pages - len(w.l1), "queued_requests": max(0, w.load - 1),
                "running_requests": min(1, w.load), "page_size": 16}

    def cut(self, w: Worker, as_proto: bool):
        """The worker's next delta batch (a KVEventBatch, or a plain object where bytes don't matter)."""
        stored, removed, written, sremoved = w.take()
        w.seq += 1
        fields = {"worker_id": w.address, "epoch": w.epoch, "seq": w.seq, "l1_stored": stored, "l1_removed": removed,
                  "store_written": written, "store_removed": sremoved, **self._load(w)}
        return KVEventBatch(**fields) if as_proto else SimpleNamespace(snapshot=False, **fields)

    def snapshot(self, w: Worker, as_proto: bool = True):
        store = self.store
        fields = {"worker_id": w.address, "epoch": w.epoch, "seq": w.seq, "snapshot": True, "l1_stored": list(w.l1),
                  "store_written": [h for h in w.written if h in store], **self._load(w)}
        if as_proto:
            return KVEventBatch(**fields)
        return SimpleNamespace(l1_removed=(), store_removed=(), **fields)


class Cand:
    """A candidate as a router sees it (address, load from its last event batch)."""

    __slots__ = ("address", "load")

    def __init__(self, address: str):
        self.address, self.load = address, 0


class PreciseRouter:
    """A router replica: its own KVIndex fed by the event streams, router/kv/choice.py's decision,
    a speculative entry per routed prompt. A worker's load: queued + running of its last batch plus
    the requests this router sent it since that batch was cut (a 50 ms old load alone herds every
    replica onto the same idle worker: 4% of the oracle's hits lost at 50 workers). The loads are
    also kept on a LoadBoard (router/kv/loads.py), as a fleet-sized router keeps them."""

    def __init__(self, cfg: SimConfig, addresses: list[str], clock):
        self.clock = clock
        self.index = KVIndex(cfg.speculative_ttl_s, clock)
        self.cands = [Cand(a) for a in addresses]
        self.by_addr = {c.address: c for c in self.cands}
        self.board = LoadBoard({a: 0 for a in addresses})
        self.sent: dict[str, deque] = {a: deque() for a in addresses}  # times this router sent it a request
        self.weights = ChoiceWeights(load_imbalance_threshold=cfg.load_imbalance_threshold)
        self.queue: deque = deque()  # (deliver time, address, batch, cut time)
        self.apply_ns = 0
        self.applied = 0
        for a in addresses:
            self.index.set_live(a, True)

    def deliver(self, addr: str, batch, cut_t: float) -> None:
        t0 = time.perf_counter_ns()
        self.index.apply(addr, batch)
        self.apply_ns += time.perf_counter_ns() - t0
        self.applied += 1
        self._load(addr, batch, cut_t)

    def _load(self, addr: str, batch, cut_t: float) -> None:
        sent = self.sent[addr]
        while sent and sent[0] <= cut_t:
            sent.popleft()
        c = self.by_addr[addr]
        c.load = batch.queued_requests + batch.running_requests + len(sent)
        self.board.set(addr, c.load)

    def routed(self, addr: str) -> None:
        c = self.by_addr[addr]
        c.load += 1
        self.board.set(addr, c.load)
        self.sent[addr].append(self.clock())

    def choose(self, hashes: list[str]) -> tuple[str, str]:
        w, why = choose_prefill(self.index, self.cands, hashes, self.weights, board=self.board)
        self.index.speculate(w.address, hashes)
        return w.address, why


class GuessRouter(PreciseRouter):
    """Today's guess-based router/policies.py CacheAware (store-aware), one per replica; it reads
    only the load numbers of the batches (the same loads as the precise router's)."""

    def __init__(self, cfg: SimConfig, addresses: list[str], clock):
        super().__init__(cfg, addresses, clock)
        self.policy = CacheAware(cfg.l1_pages, cfg.load_imbalance_threshold, store_index_pages=cfg.store_pages)

    def deliver(self, addr: str, batch, cut_t: float) -> None:
        self._load(addr, batch, cut_t)

    def choose(self, hashes: list[str]) -> tuple[str, str]:
        ctx = RouteContext(hashes)
        w, why = self.policy._choose(self.cands, ctx)
        self.policy.on_routed(w, ctx)
        return w.address, why


class OracleRouter(PreciseRouter):
    """Knows every cache exactly: one index shared by the replicas and fed each change as it
    happens (no guesses); each replica keeps its own loads, as a precise replica does (the same
    load rules, the same load knowledge: the difference is the cache knowledge alone)."""

    def __init__(self, cfg: SimConfig, addresses: list[str], clock, index: KVIndex):
        super().__init__(cfg, addresses, clock)
        self.index = index

    def deliver(self, addr: str, batch, cut_t: float) -> None:
        self._load(addr, batch, cut_t)  # the shared index had it at once

    def choose(self, hashes: list[str]) -> tuple[str, str]:
        w, why = choose_prefill(self.index, self.cands, hashes, self.weights, board=self.board)
        return w.address, why
