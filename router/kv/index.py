"""The router's precise KV index, built from the workers' KV event streams (issue 27).

Per worker: the page hashes its L1 prefix cache holds (from `KVEventBatch` l1_stored/l1_removed),
the store pages it claims (store_written), its epoch and last applied seq, and the load numbers of
its last batch. Across workers: an inverted index hash -> holders, so a prompt is matched by walking
its hashes and narrowing the holder set; the cost depends on the prompt and on how many workers
share its prefix, never on the fleet size.

Recovery rules (the protocol is proto/pdorch/v1/worker.proto, KVEventBatch):
- a snapshot replaces everything known of the worker and adopts its epoch and seq;
- a delta applies only when a snapshot of the same epoch was applied and its seq is last + 1;
  anything else is a gap: nothing applied, the caller resubscribes from `resume_point`
  (the worker replays the missed batches or sends a snapshot). A delta older than last + 1 in the
  same epoch is a duplicate of something applied: ignored, no resubscribe.
- between a gap and the next in-order batch, and while the stream is down, the worker is not live:
  its entries stay (they are probably still right) but the policy falls back for it.
Within one batch, stored is applied before removed: the worker's journal nets each hash's changes
in a batch window, so a hash is in at most one of the two lists.

Speculative entries: the routing-time guess (the pages of a prompt just routed to a worker) counts
as that worker's L1 for `speculative_ttl_s`, the seconds before the worker's own event arrives; an
l1_stored event for it confirms it, otherwise it expires (lazily, on the next call: no thread).
A prefill worker's claims (`inflight_claimed`: pages a request there is computing right now,
prefill_node/inflight.py) are entries of the same kind, for CLAIM_TTL_S at most: so every router
replica routes a request sharing a prefix in flight to the worker computing it, where it waits for
the pages; l1_stored confirms them, `inflight_released` ends the rest (its request ended).

The store: the workers' claims (router/kv/store_claims.py): a page is held while some worker claims
it, and any worker's store_removed removes it for all.

The L1 holders of a page are one address or a bitmask over worker slots (router/kv/holders.py).

Pure logic: no grpc, no asyncio; not thread-safe (the router's event loop owns it).
"""

from __future__ import annotations

import time
from collections import deque

from router.kv.candidates import CandidateView
from router.kv.holders import L1Holders
from router.kv.index_stats import index_stats
from router.kv.store_claims import StoreClaims
from router.kv.worker_kv import Guess, WorkerKV

CLAIM_TTL_S = 30.0  # a claim the worker never released (a lost stream) is forgotten after this long


class KVIndex:
    OUTCOMES = ("snapshot", "applied", "gap", "duplicate")

    def __init__(self, speculative_ttl_s: float = 5.0, clock=time.monotonic):
        self.ttl = speculative_ttl_s
        self.clock = clock
        self._workers: dict[str, WorkerKV] = {}
        self.holders = L1Holders()  # speculative entries included
        # NOTE: the holders' maps and operations, bound once: the walks below use them per page
        self._l1, self._slot, self._addr_at = self.holders.by_hash, self.holders.slot, self.holders.addr_at
        self._hold, self._unhold, self._bits = self.holders.hold, self.holders.unhold, self.holders.bits
        self._mask, self.addresses_of = self.holders.mask, self.holders.addresses_of
        self._store = StoreClaims()
        self._spec_q: deque[Guess] = deque()  # in expiry order
        self._claim_q: deque[Guess] = deque()  # the workers' claims, in expiry order (another TTL)
        self._views: list[CandidateView] = []
        self._match: tuple | None = None  # (hashes, run, mask) of the last longest_l1, while still true
        self.spec_confirmed = 0
        self.spec_expired = 0
        self.outcomes = dict.fromkeys(self.OUTCOMES, 0)

    # ------------------------------------------------------------------ candidate views
    def view(self, candidates: list) -> CandidateView:
        """The candidates' view, cached: the router passes the same workers call after call, and
        comparing two lists of the same objects is a C loop of identity checks."""
        for v in self._views:
            if v.workers == candidates:
                return v
        v = CandidateView(candidates, self._slot)
        self._views = [v, *self._views[:15]]  # prefill and decode lists, some without a failed worker
        return v

    # ------------------------------------------------------------------ events
    def _state(self, address: str) -> WorkerKV:
        w = self._workers.get(address)
        if w is None:
            w = self._workers[address] = WorkerKV()
            self.holders.add_worker(address)
            self._views = []
        return w

    def apply(self, address: str, batch) -> str:
        """Apply one KVEventBatch (or anything with its attributes); returns one of OUTCOMES."""
        self._match = None
        w = self._state(address)
        w.load = batch.queued_requests + batch.running_requests
        w.free_pages = batch.free_pages
        if batch.snapshot:
            self._clear_l1(address, w)
            self._store.clear(address)
            self._store_l1(address, w, batch.l1_stored)
            self._store.write(address, batch.store_written)
            self._unclaim(address, w, [h for h, g in w.spec.items() if g.claim])
            self._claim(address, w, batch.inflight_claimed)
            w.epoch, w.seq, w.has_snapshot, w.behind = batch.epoch, batch.seq, True, False
            w.page_size, w.worker_id = batch.page_size, batch.worker_id
            outcome = "snapshot"
        elif not w.has_snapshot or batch.epoch != w.epoch or batch.seq > w.seq + 1:
            w.behind = True
            outcome = "gap"
        elif batch.seq <= w.seq:
            outcome = "duplicate"
        else:
            self._store_l1(address, w, batch.l1_stored)
            self._remove_l1(address, w, batch.l1_removed)
            self._store.write(address, batch.store_written)
            self._store.remove(batch.store_removed)
            self._claim(address, w, batch.inflight_claimed)
            self._unclaim(address, w, batch.inflight_released)
            w.seq, w.behind = batch.seq, False
            outcome = "applied"
        self.outcomes[outcome] += 1
        return outcome

    # NOTE: the set arithmetic below runs in C; only pages shared with other workers (or confirming
    # a speculation) take a Python step each. An event stream of 1,000 workers brings ~10^6 hashes/s.
    def _store_l1(self, address, w, hashes) -> None:
        new = set(hashes)
        new -= w.l1
        if not new:
            return
        w.l1 |= new
        spec = w.spec
        if spec:
            conf = new.intersection(spec)
            if conf:
                for h in conf:
                    spec.pop(h).pending -= 1  # already in the holders
                self.spec_confirmed += len(conf)
                new -= conf
        holders = self._l1
        fresh = new.difference(holders)
        if fresh:
            holders.update(dict.fromkeys(fresh, address))
        if len(fresh) != len(new):
            hold = self._hold
            for h in new.difference(fresh):
                hold(h, address)

    def _remove_l1(self, address, w, hashes) -> None:
        gone = w.l1.intersection(hashes)
        if not gone:
            return
        w.l1 -= gone
        if w.spec:
            gone.difference_update(w.spec)  # a speculation keeps it held until it expires
        holders, unhold = self._l1, self._unhold
        for h in gone:
            if holders[h] == address:
                del holders[h]
            else:
                unhold(h, address)

    def _clear_l1(self, address, w) -> None:
        spec, unhold = w.spec, self._unhold
        for h in w.l1:
            if h not in spec:
                unhold(h, address)
        w.l1 = set()

    def clear_store(self) -> None:
        """The whole store was cleared (the router's /flush_cache?store=true, which no worker sees)."""
        self._store.clear_all()

    # ------------------------------------------------------------------ stream state
    def resume_point(self, address: str) -> tuple[str, int]:
        w = self._workers.get(address)
        if w is None or not w.has_snapshot:
            return "", 0
        return w.epoch, w.seq

    def set_live(self, address: str, live: bool) -> None:
        self._state(address).live = live

    def is_live(self, address: str) -> bool:
        w = self._workers.get(address)
        return w is not None and w.live and w.has_snapshot and not w.behind

    def drop_worker(self, address: str) -> None:
        w = self._workers.pop(address, None)
        if w is None:
            return
        self._match = None
        for h in w.l1:
            self._unhold(h, address)
        for h in w.spec:
            self._unhold(h, address)
        self._store.clear(address)
        self.holders.drop_worker(address)
        self._views = []
        # its guesses in _spec_q find no worker (or a new one, whose spec holds other guesses): skipped

    def load(self, address: str) -> int | None:
        w = self._workers.get(address)
        return None if w is None else w.load

    def free_pages(self, address: str) -> int | None:
        w = self._workers.get(address)
        return None if w is None else w.free_pages

    # ------------------------------------------------------------------ claims (pages in flight)
    def _claim(self, address, w, hashes) -> None:
        if hashes:
            self._match = None
            self._guess(address, w, set(hashes), self.clock() + CLAIM_TTL_S, claim=True)

    def _unclaim(self, address, w, hashes) -> None:
        """Claims that ended: their pages not in L1 (see l1_stored) are no longer held there."""
        spec = w.spec
        for h in hashes:
            g = spec.get(h)
            if g is None or not g.claim:
                continue
            del spec[h]
            g.pending -= 1
            if h not in w.l1:
                self._unhold(h, address)
                self._match = None

    def claimed(self, address: str, h: str) -> bool:
        """Whether `address` holds page `h` only by a claim (its request computes it right now)."""
        w = self._workers.get(address)
        g = None if w is None else w.spec.get(h)
        return g is not None and g.claim

    # ------------------------------------------------------------------ speculation
    def speculate(self, address: str, hashes: list[str]) -> None:
        """Count `hashes` as `address`'s L1 for the next `ttl` seconds (until its events say so).

        NOTE: when the last longest_l1 walked this very prompt and found `address` holding its first
        `run` pages (and nothing changed since), only the pages after them are guessed: a later turn
        routed to its holder adds a few pages to guess, not the whole prompt again (at 1,000 workers
        the guess and its expiry were a third of a long prompt's decision). Those held pages that are
        themselves guesses keep their expiry (their worker's events confirm them)."""
        now = self.clock()
        self._expire(now)
        w = self._state(address)
        m = self._match
        if m is not None and m[0] is hashes and m[2] >> self._slot[address] & 1:
            hashes = hashes[m[1]:]
        self._guess(address, w, set(hashes), now + self.ttl)

    def _guess(self, address: str, w: WorkerKV, new: set[str], exp: float, claim: bool = False) -> None:
        """Count `new` (less what its L1 holds) as `address`'s L1 until `exp` or its events confirm them."""
        new -= w.l1
        if not new:
            return
        guess = Guess(exp, address, new, claim)
        spec = w.spec
        fresh = new.difference(spec)
        if len(fresh) != len(new):  # guessed again before its worker confirmed it: the newer guess owns it
            for h in new.difference(fresh):
                spec[h].pending -= 1
        spec.update(dict.fromkeys(new, guess))
        if fresh:
            holders = self._l1
            unheld = fresh.difference(holders)
            if unheld:
                holders.update(dict.fromkeys(unheld, address))
            if len(unheld) != len(fresh):
                hold = self._hold
                for h in fresh.difference(unheld):
                    hold(h, address)
        (self._claim_q if claim else self._spec_q).append(guess)

    def _expire(self, now: float) -> None:
        # NOTE: the head's expiry checked here: most calls (three a request) find nothing due
        for q in (self._spec_q, self._claim_q):
            if q and q[0].exp <= now:
                self._expire_queue(q, now)

    def _expire_queue(self, q: deque[Guess], now: float) -> None:
        while q and q[0].exp <= now:
            guess = q.popleft()
            if not guess.pending:  # all confirmed or guessed again: nothing of it left
                continue
            w = self._workers.get(guess.address)
            if w is None:
                continue
            spec, l1 = w.spec, w.l1
            for h in guess.hashes:
                if spec.get(h) is guess:  # not confirmed, not guessed again since
                    del spec[h]
                    self.spec_expired += 1
                    if h not in l1:
                        self._unhold(h, guess.address)
                        self._match = None  # what the last walk saw held may be gone

    # ------------------------------------------------------------------ matching
    def l1_runs(self, hashes: list[str], addresses=None) -> dict[str, int]:
        """Leading run of `hashes` each address's L1 holds (unexpired speculative entries included).

        Only addresses with a run > 0 appear (absent: 0). `addresses`: an iterable of addresses or
        a CandidateView to restrict to (None: every worker). Cost: the prompt's pages plus the
        holders found, not the fleet."""
        if not hashes:
            return {}
        self._expire(self.clock())
        holders = self._l1
        cur = holders.get(hashes[0])
        if cur is None:
            return {}
        if isinstance(cur, str):  # one holder: walk its own sets
            if addresses is not None and not (self._mask(addresses) >> self._slot[cur]) & 1:
                return {}
            return {cur: self._walk_one(cur, hashes, 1)}
        alive = cur if addresses is None else cur & self._mask(addresses)
        runs: dict[str, int] = {}
        i, n = 1, len(hashes)
        while alive and i < n:
            nxt = holders.get(hashes[i])
            if nxt is None:
                break
            still = alive & self._bits(nxt)
            if still != alive:
                for a in self.addresses_of(alive & ~still):
                    runs[a] = i
            alive = still
            i += 1
        for a in self.addresses_of(alive):
            runs[a] = i
        return runs

    def _walk_one(self, address: str, hashes: list[str], i: int) -> int:
        w = self._workers[address]
        l1, spec = w.l1, w.spec
        n = len(hashes)
        while i < n and (hashes[i] in l1 or hashes[i] in spec):
            i += 1
        return i

    def longest_l1(self, hashes: list[str], addresses=None) -> tuple[int, int]:
        """(the longest leading run of `hashes` some address's L1 holds, the mask of the addresses
        holding it; `addresses_of` names them): l1_runs without the others' runs."""
        if not hashes:
            return 0, 0
        self._expire(self.clock())
        holders = self._l1
        cur = holders.get(hashes[0])
        if cur is None:
            return 0, 0
        alive = self._bits(cur)
        if addresses is not None:
            alive &= self._mask(addresses)
        if not alive:
            return 0, 0
        i, n = 1, len(hashes)
        while i < n:
            nxt = holders.get(hashes[i])
            if nxt is None:
                break
            if isinstance(nxt, str):  # one holder left at most: walk its own sets
                bit = 1 << self._slot[nxt]
                if not alive & bit:
                    break
                run = self._walk_one(nxt, hashes, i + 1)
                self._match = (hashes, run, bit)
                return run, bit
            still = alive & nxt
            if not still:
                break
            alive = still
            i += 1
        self._match = (hashes, i, alive)
        return i, alive

    def store_run(self, hashes: list[str]) -> int:
        return self._store.run(hashes)

    # ------------------------------------------------------------------ introspection
    def workers(self) -> list[str]:
        return list(self._workers)

    def stats(self) -> dict:
        return index_stats(self)
