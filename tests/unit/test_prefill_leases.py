"""I/O leases of a prefill task (prefill_node/leases.py): each submission holds one named lease until
its own completion gives it back; a lease given back twice (a negative counter before) raises."""

from __future__ import annotations

import time

import pytest

from pdorch.worker.leases import IOLeases, LeaseError
from prefill_node.leases import PUSH, STORE_LOAD, STORE_SAVE
from store_client.page_hash import page_hashes, store_key
from tests.unit.test_prefill_scheduler import FakeStoreIO, abort, make, settle, submit


def test_a_lease_is_held_from_take_to_give_back():
    io = IOLeases()
    io.take(STORE_LOAD)
    io.take(PUSH)
    assert (len(io), STORE_LOAD in io, STORE_SAVE in io) == (2, True, False)
    io.give_back(STORE_LOAD)
    io.give_back(PUSH)
    assert len(io) == 0


def test_giving_back_a_lease_not_held_or_taking_one_twice_raises():
    io = IOLeases()
    with pytest.raises(LeaseError):
        io.give_back(PUSH)
    io.take(PUSH)
    with pytest.raises(LeaseError):
        io.take(PUSH)
    io.give_back(PUSH)
    with pytest.raises(LeaseError):
        io.give_back(PUSH)


def test_an_answered_task_keeps_its_pages_while_its_store_load_holds_a_lease():
    tokens = list(range(50, 62))
    io = FakeStoreIO(present=[store_key("fp", h) for h in page_hashes(tokens, 4)])
    io.hold.set()
    sched, rt, _ = make(store_io=io)
    try:
        task = submit(sched, tokens, "x")
        deadline = time.monotonic() + 10
        while not io.loads:
            assert time.monotonic() < deadline, "the task never started its store load"
            time.sleep(0.005)
        abort(sched, "x")
        assert sched.call(lambda: (STORE_LOAD in task.io, len(task.page_ids))) == (True, 3)
        io.release()
        settle(sched, rt)
        assert (len(task.io), task.page_ids) == (0, [])
    finally:
        sched.stop()
