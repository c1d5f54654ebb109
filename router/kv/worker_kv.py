"""What the router's KV index (router/kv/index.py) keeps per worker, and one routing-time guess."""

from __future__ import annotations


class Guess:
    """One speculate() call, or one claim of pages in flight from the worker's events (`claim`): its
    pages, until `exp`; `pending`: how many of them are still this guess's (not confirmed by the
    worker's events, not guessed again since), so an expiry with none left is one check, not a walk
    of its pages."""

    __slots__ = ("address", "claim", "exp", "hashes", "pending")

    def __init__(self, exp: float, address: str, hashes: set[str], claim: bool = False):
        self.exp, self.address, self.hashes, self.pending = exp, address, hashes, len(hashes)
        self.claim = claim


class WorkerKV:
    __slots__ = ("behind", "epoch", "free_pages", "has_snapshot", "l1", "live", "load", "page_size",
                 "seq", "spec", "worker_id")

    def __init__(self):
        self.epoch, self.seq = "", 0
        self.has_snapshot = False
        self.behind = False  # a gap seen since the last in-order batch
        self.live = False
        self.l1: set[str] = set()
        self.spec: dict[str, Guess] = {}  # speculative hash -> the guess that owns it (not in l1)
        self.load: int | None = None
        self.free_pages: int | None = None
        self.page_size = 0
        self.worker_id = ""
