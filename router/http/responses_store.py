"""Stored responses (`store: true`): what `previous_response_id` continues and `GET /v1/responses/{id}`
returns. In the router's memory, bounded: at most `max_entries` responses and `max_bytes` of them,
least recently used first out, and a response unused for `ttl_s` is gone.

A response stores only its own turn: this turn's input and its output as chat messages, and the
Response object, both as compact JSON bytes (so the bytes counted are the memory held), with its
parent's id. A chain is read back by walking up to its first response. Reading or extending a chain
touches every response in it, its oldest last, so a response always outlives the turns that follow
it (eviction takes the newest leaves first, never a link out of the middle of a chain in use).

One router process, one store: behind several router replicas a chain continues only on the replica
that stored it (docs/api.md). Everything runs on the event loop's thread: no locks.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from router.errors import APIError

log = logging.getLogger("pdorch.router")

_ENTRY_OVERHEAD = 256  # bytes of bookkeeping counted per stored response (key, entry object)


@dataclass(frozen=True)
class StoreLimits:
    max_entries: int
    max_bytes: int
    ttl_s: float


class _Stored:
    __slots__ = ("expires", "messages", "parent", "response", "root", "size")

    def __init__(self, parent: str | None, root: str, messages: bytes, response: bytes):
        self.parent, self.root = parent, root
        self.messages, self.response = messages, response  # JSON: this turn's chat messages; the Response
        self.size = len(messages) + len(response) + _ENTRY_OVERHEAD
        self.expires = 0.0


@dataclass(frozen=True)
class Chain:
    """A stored response's conversation: its first response's id (the session key) and the chat
    messages of every turn up to it, as JSON pieces in order."""
    root: str
    turns: list[bytes]


def not_found(response_id: str, why: str = "not found", param: str | None = "previous_response_id") -> APIError:
    """OpenAI's answer for an unknown id."""
    code = "previous_response_not_found" if param == "previous_response_id" else "response_not_found"
    return APIError(404, f"response {response_id[:100]!r} {why}", "invalid_request_error", param, code)


class ResponseStore:
    def __init__(self, limits: StoreLimits, clock: Callable[[], float] = time.monotonic):
        self.limits = limits
        self.clock = clock
        self._entries: OrderedDict[str, _Stored] = OrderedDict()  # least recently used first
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def _live(self, response_id: str, now: float) -> _Stored | None:
        entry = self._entries.get(response_id)
        if entry is not None and entry.expires <= now:
            self._drop(response_id)
            return None
        return entry

    def _touch(self, ids: list[str], now: float) -> None:
        """Most recently used, in this order (the chain's first response last: it outlives the rest)."""
        expires = now + self.limits.ttl_s
        for response_id in ids:
            self._entries.move_to_end(response_id)
            self._entries[response_id].expires = expires

    def chain(self, response_id: str) -> Chain:
        """The conversation up to `response_id`; 404 (previous_response_not_found) when it, or an
        earlier response of its chain, is not stored (never stored, expired, evicted or deleted)."""
        now = self.clock()
        ids, turns = [], []
        current: str | None = response_id
        while current is not None:
            entry = self._live(current, now)
            if entry is None:
                why = "not found" if current == response_id else f"continues {current!r}, which is no longer stored"
                raise not_found(response_id, why)
            ids.append(current)
            turns.append(entry.messages)
            current = entry.parent
        self._touch(ids, now)
        turns.reverse()
        return Chain(ids[-1], turns)

    def put(self, response_id: str, parent: str | None, root: str, messages: bytes, response: bytes) -> bool:
        """Store a finished response; False when it is not kept (larger than the store alone, or
        evicted at once: every other stored response is an earlier turn of its chain)."""
        entry = _Stored(parent, root, messages, response)
        if entry.size > self.limits.max_bytes:
            log.warning("response %s (%d bytes) is larger than the response store (router.responses_store_max_mb): "
                        "not stored", response_id, entry.size)
            return False
        now = self.clock()
        self._evict_expired(now)
        self._entries[response_id] = entry
        self.bytes += entry.size
        ancestors = []
        while parent is not None and parent in self._entries:
            ancestors.append(parent)
            parent = self._entries[parent].parent
        self._touch([response_id, *ancestors], now)
        while len(self._entries) > self.limits.max_entries or self.bytes > self.limits.max_bytes:
            self._drop(next(iter(self._entries)))
        return response_id in self._entries

    def response(self, response_id: str) -> bytes:
        """The stored Response object (JSON); 404 naming no field otherwise. A read counts as a use."""
        now = self.clock()
        entry = self._live(response_id, now)
        if entry is None:
            raise not_found(response_id, param=None)
        self._touch([response_id], now)
        return entry.response

    def delete(self, response_id: str) -> None:
        if self._live(response_id, self.clock()) is None:
            raise not_found(response_id, param=None)
        self._drop(response_id)

    def _evict_expired(self, now: float) -> None:
        # NOTE: least recently used first = soonest to expire first: stop at the first live one
        while self._entries:
            oldest = next(iter(self._entries))
            if self._entries[oldest].expires > now:
                return
            self._drop(oldest)

    def _drop(self, response_id: str) -> None:
        self.bytes -= self._entries.pop(response_id).size
