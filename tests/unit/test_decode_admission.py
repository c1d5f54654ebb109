"""Decode admission: watermark, bounded wait queue, deadline and cancellation while waiting."""

import threading
import time

import pytest

from decode_node.admission import Admission
from engine.page_allocator import PageAllocator
from pdorch.worker.errors import Aborted, DeadlineExceeded, InvalidRequest, Overloaded


def never():
    return False


def test_admits_under_watermark_and_waits_above_it():
    alloc = PageAllocator(10)
    adm = Admission(alloc, max_queued=4, watermark=0.8)
    first = adm.admit("a", 6, time.monotonic() + 1, never)
    assert first == [0, 1, 2, 3, 4, 5]
    assert adm.admit("b", 2, time.monotonic() + 1, never) == [6, 7]  # 8 <= 0.8 * 10
    # 9 > 8: must wait until pages come back
    got = {}
    t = threading.Thread(target=lambda: got.update(ids=adm.admit("c", 1, time.monotonic() + 5, never)))
    t.start()
    time.sleep(0.3)
    assert "ids" not in got and adm.waiting == 1
    adm.release(first)
    t.join(5)
    assert got["ids"] == [8] and adm.waiting == 0
    alloc.check_integrity()


def test_idle_pool_admits_a_request_bigger_than_the_watermark():
    adm = Admission(PageAllocator(10), max_queued=1, watermark=0.5)
    assert len(adm.admit("big", 10, time.monotonic() + 1, never)) == 10


def test_waiting_request_hits_its_deadline_with_a_clear_error():
    alloc = PageAllocator(4)
    adm = Admission(alloc, max_queued=4, watermark=1.0)
    adm.admit("a", 4, time.monotonic() + 1, never)
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceeded, match="waited .* for 1 KV pages"):
        adm.admit("b", 1, time.monotonic() + 0.5, never)
    # not before its deadline; the upper bound only rules out a hang (shared machines are slow)
    assert 0.45 <= time.monotonic() - t0 < 10.0
    assert adm.waiting == 0


def test_cancelled_while_waiting_and_queue_bound():
    alloc = PageAllocator(4)
    adm = Admission(alloc, max_queued=1, watermark=1.0)
    adm.admit("a", 4, time.monotonic() + 1, never)
    cancel = threading.Event()
    errors = []

    def wait_b():
        try:
            adm.admit("b", 1, time.monotonic() + 10, cancel.is_set)
        except Aborted as e:
            errors.append(e)

    t = threading.Thread(target=wait_b)
    t.start()
    time.sleep(0.2)
    with pytest.raises(Overloaded, match="max_queued_requests"):
        adm.admit("c", 1, time.monotonic() + 10, never)
    cancel.set()
    t.join(5)
    assert len(errors) == 1 and adm.waiting == 0


def test_request_larger_than_the_pool_is_rejected():
    adm = Admission(PageAllocator(4), max_queued=1, watermark=1.0)
    with pytest.raises(InvalidRequest, match="decode.num_pages"):
        adm.admit("x", 5, time.monotonic() + 1, never)
