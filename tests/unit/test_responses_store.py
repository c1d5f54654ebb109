"""router/http/responses_store.py: the stored responses' bounds (entries, bytes), expiry and LRU order,
and chains read back whole or not at all (pure logic, a fake clock)."""

from __future__ import annotations

import pytest

from router.errors import APIError
from router.http.responses_store import _ENTRY_OVERHEAD, ResponseStore, StoreLimits


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def store(max_entries: int = 100, max_bytes: int = 1 << 20, ttl_s: float = 60.0) -> tuple[ResponseStore, Clock]:
    clock = Clock()
    return ResponseStore(StoreLimits(max_entries, max_bytes, ttl_s), clock), clock


def put(s: ResponseStore, rid: str, parent: str | None = None, size: int = 10) -> bool:
    root = s.chain(parent).root if parent else rid
    return s.put(rid, parent, root, b"m" * size, b"{}")


def missing(fn, *args) -> APIError:
    with pytest.raises(APIError) as e:
        fn(*args)
    assert e.value.status == 404
    return e.value


def test_a_chain_reads_back_every_turn_in_order_with_its_first_id():
    s, _ = store()
    s.put("r1", None, "r1", b"[1]", b'{"id":"r1"}')
    s.put("r2", "r1", "r1", b"[2]", b'{"id":"r2"}')
    s.put("r3", "r2", "r1", b"[3]", b'{"id":"r3"}')
    s.put("b2", "r1", "r1", b"[4]", b'{"id":"b2"}')  # a branch from the first turn
    chain = s.chain("r3")
    assert (chain.root, chain.turns) == ("r1", [b"[1]", b"[2]", b"[3]"])
    assert s.chain("b2").turns == [b"[1]", b"[4]"]
    assert s.response("r2") == b'{"id":"r2"}'


def test_an_unknown_id_is_openais_404_naming_previous_response_id():
    s, _ = store()
    err = missing(s.chain, "resp_nope")
    assert err.body() == {"error": {"message": "response 'resp_nope' not found", "type": "invalid_request_error",
                                    "param": "previous_response_id", "code": "previous_response_not_found"}}
    assert missing(s.response, "resp_nope").body()["error"]["code"] == "response_not_found"
    assert missing(s.delete, "resp_nope").body()["error"]["param"] is None


def test_an_unused_response_expires_after_ttl_and_a_use_renews_it():
    s, clock = store(ttl_s=60)
    put(s, "a")
    put(s, "b")
    clock.now += 50
    s.chain("a")  # used: 60 s from now
    clock.now += 20
    assert s.chain("a").root == "a"
    missing(s.chain, "b")  # unused for 70 s
    assert s.bytes == 10 + 2 + _ENTRY_OVERHEAD  # its bytes are given back
    clock.now += 61
    missing(s.response, "a")


def test_the_least_recently_used_goes_first_past_max_entries():
    s, _ = store(max_entries=3)
    for rid in "abc":
        put(s, rid)
    s.response("a")  # a read is a use
    put(s, "d")
    assert len(s) == 3
    missing(s.chain, "b")
    assert s.chain("a") and s.chain("c") and s.chain("d")


def test_the_bytes_held_never_pass_max_bytes():
    entry = 100 + 2 + _ENTRY_OVERHEAD
    s, _ = store(max_bytes=3 * entry)
    for i in range(10):
        assert put(s, f"r{i}", size=100)
        assert s.bytes <= 3 * entry
    assert len(s) == 3 and s.bytes == 3 * entry
    assert not put(s, "huge", size=3 * entry)  # larger than the store alone: not stored, nothing evicted
    assert len(s) == 3
    missing(s.chain, "huge")


def test_an_earlier_turn_outlives_the_turns_after_it():
    """Eviction takes leaves first: extending a chain keeps its first turns the most recently used."""
    s, _ = store(max_entries=4)
    put(s, "r1")
    put(s, "r2", "r1")
    put(s, "r3", "r2")
    put(s, "other")  # more recent than r3 but not than r1, r2 (touched when r3 was stored)
    put(s, "x")  # evicts r3: the oldest leaf
    missing(s.chain, "r3")
    assert s.chain("r2").turns == [b"m" * 10, b"m" * 10]


def test_a_chain_through_a_deleted_or_expired_response_is_a_404_naming_the_gap():
    s, _ = store()
    put(s, "r1")
    put(s, "r2", "r1")
    put(s, "r3", "r2")
    s.delete("r2")
    missing(s.response, "r2")
    err = missing(s.chain, "r3")
    assert err.param == "previous_response_id" and "'r2', which is no longer stored" in err.message
    assert s.chain("r1").turns == [b"m" * 10]
