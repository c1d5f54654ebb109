"""Decode admission: watermark, bounded wait queue, deadline and cancellation while waiting.

Driven through the real DecodeScheduler thread (it owns the allocator; handler threads post tickets).
"""

import concurrent.futures
import threading
import time

import pytest

from decode_node.admission import Admission, AdmitTicket
from decode_node.growth import GrowthReserve
from decode_node.scheduler import DecodeScheduler
from engine.page_allocator import PageAllocator
from pdorch.worker.errors import Aborted, DeadlineExceeded, InvalidRequest, Overloaded
from pdorch.worker.metrics import WorkerRecorder
from tests.fixtures.runtime import stand_in_runtime


def never():
    return False


@pytest.fixture
def make():
    made = []

    def _make(num_pages: int, max_queued: int, watermark: float, prefix_cache: bool = False,
              reserve: GrowthReserve | None = None, share_inflight: bool = False) -> DecodeScheduler:
        rt = stand_in_runtime(None, num_pages, page_size=4, max_positions=64)  # no forward runs here
        sched = DecodeScheduler(rt, max_running=4, offload=False, recorder=WorkerRecorder("decode"),
                                max_queued=max_queued, watermark=watermark, prefix_cache=prefix_cache,
                                reserve=reserve, share_inflight=share_inflight)
        sched.start()
        made.append(sched)
        return sched

    yield _make
    for sched in made:
        sched.stop()


def until(cond, what: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_admits_under_watermark_and_waits_above_it(make):
    sched = make(10, max_queued=4, watermark=0.8)
    first = sched.admit("a", 6, time.monotonic() + 1, never)
    assert first == [0, 1, 2, 3, 4, 5]
    assert sched.admit("b", 2, time.monotonic() + 1, never) == [6, 7]  # 8 <= 0.8 * 10
    # 9 > 8: must wait until pages come back
    with concurrent.futures.ThreadPoolExecutor(1) as handler:
        c = handler.submit(sched.admit, "c", 1, time.monotonic() + 5, never)
        until(lambda: sched.admission.waiting == 1, "c never queued")
        assert not c.done()
        sched.release(first)
        assert c.result(5) == [0] and sched.admission.waiting == 0  # free pages go out lowest run first
    sched.call(sched._rt.allocator.check_integrity)


def test_idle_pool_admits_a_request_bigger_than_the_watermark(make):
    sched = make(10, max_queued=1, watermark=0.5)
    assert len(sched.admit("big", 10, time.monotonic() + 1, never)) == 10


def test_waiting_request_hits_its_deadline_with_a_clear_error(make):
    sched = make(4, max_queued=4, watermark=1.0)
    sched.admit("a", 4, time.monotonic() + 1, never)
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceeded, match="waited .* for 1 KV pages"):
        sched.admit("b", 1, time.monotonic() + 0.5, never)
    # not before its deadline; the upper bound only rules out a hang (shared machines are slow)
    assert 0.45 <= time.monotonic() - t0 < 10.0
    assert sched.admission.waiting == 0


def test_cancelled_while_waiting_and_queue_bound(make):
    sched = make(4, max_queued=1, watermark=1.0)
    sched.admit("a", 4, time.monotonic() + 1, never)
    cancel = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(1) as handler:
        b = handler.submit(sched.admit, "b", 1, time.monotonic() + 10, cancel.is_set)
        until(lambda: sched.admission.waiting == 1, "b never queued")
        with pytest.raises(Overloaded, match="max_queued_requests"):
            sched.admit("c", 1, time.monotonic() + 10, never)
        cancel.set()
        sched.wake()  # what Abort does after setting req.cancelled
        with pytest.raises(Aborted):
            b.result(5)
    assert sched.admission.waiting == 0


def test_request_larger_than_the_pool_is_rejected(make):
    sched = make(4, max_queued=1, watermark=1.0)
    with pytest.raises(InvalidRequest, match="decode.num_pages"):
        sched.admit("x", 5, time.monotonic() + 1, never)


def test_prefix_cache_hits_are_taken_as_they_are_and_only_the_rest_is_allocated(make):
    sched = make(10, max_queued=1, watermark=1.0, prefix_cache=True)
    alloc = sched._rt.allocator
    first = sched.admit("a", 4, time.monotonic() + 1, never)  # [0, 1, 2, 3]
    sched.call(lambda: [alloc.cache(h, p) for h, p in zip(("h0", "h1", "h2"), first)])  # served: cached
    sched.release(first)  # evictable now, still matchable
    # The next turn: pages 0 and 2 of its prompt are cached ("h1" is not its page 1), 5 pages in all.
    pages, hits, _ = sched.admit_prompt("b", 5, time.monotonic() + 1, never, lookup=("h0", "x1", "h2"))
    assert hits == (0, 2)
    assert (pages[0], pages[2]) == (first[0], first[2])  # shared, not copied
    assert pages[1] not in first[:3] and len(set(pages)) == 5
    assert sched.call(lambda: [alloc.ref_count(p) for p in pages]) == [1] * 5
    assert sched.cache.hits._value.get() == 2  # pdorch_decode_l1_hit_pages_total
    # The cache off: the same call allocates everything
    off = make(10, max_queued=1, watermark=1.0)
    pages, hits, _ = off.admit_prompt("c", 3, time.monotonic() + 1, never, lookup=("h0",))
    assert hits == () and len(pages) == 3
    sched.call(alloc.check_integrity)


def test_admission_keeps_back_a_share_of_what_admitted_requests_may_still_grow(make):
    sched = make(20, max_queued=4, watermark=1.0, reserve=GrowthReserve(0.5, 0.5))
    a = sched.admit_prompt("a", 4, time.monotonic() + 5, never, growth=10)[0]
    # 4 + 4 new + half of (10 + 10) = 18 <= 20
    assert len(sched.admit_prompt("b", 4, time.monotonic() + 5, never, growth=10)[0]) == 4
    with concurrent.futures.ThreadPoolExecutor(1) as handler:
        # 8 + 4 + half of 30 = 27 > 20, though its 4 pages are free: it waits
        c = handler.submit(sched.admit_prompt, "c", 4, time.monotonic() + 5, never, growth=10)
        until(lambda: sched.admission.waiting == 1, "c never queued")
        time.sleep(0.1)
        assert not c.done()
        sched.release(a, "a")  # a failed before joining: its pages and its growth are gone
        assert len(c.result(5)[0]) == 4
    sched.call(sched._rt.allocator.check_integrity)


def test_an_admit_message_is_answered_at_once_when_it_fits_and_waits_otherwise():
    """The scheduler calls admission once per Admit message: a ticket that fits gets its pages in that
    call (with the ones queued before it that fit); one that does not, or any while a preempted request
    waits (hold), stays queued."""
    admission = Admission(PageAllocator(10), max_queued=4, watermark=1.0)
    fits = AdmitTicket("a", 2, time.monotonic() + 5, never)
    admission.admit(fits, time.monotonic(), lambda t: None)
    assert fits.future.result(0) == [0, 1] and admission.waiting == 0
    held = AdmitTicket("b", 2, time.monotonic() + 5, never)
    admission.admit(held, time.monotonic(), lambda t: None, hold=True)
    assert not held.future.done() and admission.waiting == 1
    too_many = AdmitTicket("c", 9, time.monotonic() + 5, never)
    admission.admit(too_many, time.monotonic(), lambda t: None)  # answers the queue in order: b fits now
    assert held.future.result(0) == [2, 3] and not too_many.future.done() and admission.waiting == 1


def test_nothing_new_is_admitted_while_a_preempted_request_waits():
    admission = Admission(PageAllocator(10), max_queued=4, watermark=1.0)
    ticket = AdmitTicket("t", 2, time.monotonic() + 5, never)
    admission.offer(ticket)
    admission.admit_ready(time.monotonic(), lambda t: None, hold=True)
    assert not ticket.future.done() and admission.waiting == 1
    admission.admit_ready(time.monotonic(), lambda t: None)
    assert ticket.future.result(0) == [0, 1]


# --- in-flight sharing: a request waits for the prompt pages another one is filling --------------------

def admit_in_thread(sched, rid: str, lookup: tuple, n: int = 4):
    box: dict = {}
    t = threading.Thread(target=lambda: box.update(got=sched.admit_prompt(rid, n, time.monotonic() + 10, never,
                                                                          lookup=lookup)))
    t.start()
    return t, box


def test_a_request_waits_for_the_pages_another_is_filling_and_shares_them(make):
    """a's lookup misses h0-h2: it claims them (P is pushing them). b, the same prompt, waits (c, another
    prompt, is admitted meanwhile); once a's prompt is in place (cached, `filled`) b gets a's very pages
    as hits, counted as shared."""
    sched = make(16, max_queued=4, watermark=1.0, prefix_cache=True, share_inflight=True)
    alloc, lookup = sched._rt.allocator, ("h0", "h1", "h2")
    a = sched.admit_prompt("a", 4, time.monotonic() + 5, never, lookup=lookup)
    assert a.hits == () and a.shared == 0
    t, box = admit_in_thread(sched, "b", lookup)
    c = sched.admit_prompt("c", 4, time.monotonic() + 5, never, lookup=("x0", "x1"))
    assert len(c.pages) == 4 and not box, "b was admitted while a's pages were still being filled"

    def in_place():
        for h, page in zip(lookup, a.pages):
            alloc.cache(h, page)
        sched.admission.filled("a")
    sched.call(in_place)
    t.join(5)
    b = box["got"]
    assert b.hits == (0, 1, 2) and b.shared == 3 and b.pages[:3] == a.pages[:3]
    m = sched.admission._metrics
    assert (m.waits.labels("shared")._value.get(), m.pages._value.get()) == (1, 3)
    sched.release(a.pages + b.pages + c.pages)
    sched.call(alloc.check_integrity)


def test_a_waiting_request_goes_on_without_the_pages_when_their_owner_fails(make):
    sched = make(16, max_queued=4, watermark=1.0, prefix_cache=True, share_inflight=True)
    a = sched.admit_prompt("a", 4, time.monotonic() + 5, never, lookup=("h0", "h1"))
    t, box = admit_in_thread(sched, "b", ("h0", "h1"))
    time.sleep(0.2)
    assert not box
    sched.release(a.pages, "a")  # a failed before its prompt was in place
    t.join(5)
    assert box["got"].hits == () and box["got"].shared == 0
    assert sched.admission._metrics.waits.labels("owner_gone")._value.get() == 1
    sched.release(box["got"].pages)
    sched.call(sched._rt.allocator.check_integrity)
