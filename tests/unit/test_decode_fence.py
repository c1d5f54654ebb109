"""PageFence: pages of a failed prefill go back only once P confirms its write is over; counted outcomes.

The confirmation is a small fake here (P's answer); tests/integration/test_decode_fence.py runs the
real decode worker against a prefill worker that keeps "pushing".
"""

from __future__ import annotations

import threading
import time

from prometheus_client import CollectorRegistry

from decode_node.fence import PageFence
from engine.page_allocator import PageAllocator


class FakeP:
    """Answers the fence's question with whatever the test set (None = 'push still running')."""

    def __init__(self):
        self.answer = None
        self.asked = 0
        self.lock = threading.Lock()

    def confirm(self, address, request_id):
        with self.lock:
            self.asked += 1
            return self.answer


def wait_for(cond, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def metric(registry, name, **labels):
    return registry.get_sample_value(name, labels) or 0.0


def make(p: FakeP, **kw):
    alloc, registry = PageAllocator(8), CollectorRegistry()
    fence = PageFence(alloc.release, p.confirm, registry, retry_s=0.02, **kw)
    return fence, alloc, registry


def test_pages_stay_out_until_p_confirms_then_come_back():
    p = FakeP()
    fence, alloc, registry = make(p)
    try:
        pages = alloc.allocate(3)
        fence.hold("p:1", "r1", pages)
        wait_for(lambda: p.asked >= 5)  # asked again and again, never released meanwhile
        assert alloc.num_available() == 5
        assert metric(registry, "pdorch_decode_fence_pending_pages") == 3
        p.answer = "confirmed"
        wait_for(lambda: alloc.num_available() == 8)
        alloc.check_integrity()
        assert fence.counts["confirmed"] == 3
        assert metric(registry, "pdorch_decode_fenced_pages_total", outcome="confirmed") == 3
        assert metric(registry, "pdorch_decode_fence_pending_pages") == 0
    finally:
        fence.stop()


def test_a_dead_prefill_worker_releases_the_pages_as_peer_gone():
    p = FakeP()
    p.answer = "peer_gone"
    fence, alloc, registry = make(p)
    try:
        fence.hold("p:1", "r1", alloc.allocate(2))
        wait_for(lambda: alloc.num_available() == 8)
        assert metric(registry, "pdorch_decode_fenced_pages_total", outcome="peer_gone") == 2
    finally:
        fence.stop()


def test_past_the_deadline_pages_are_held_on_purpose_and_a_late_confirmation_frees_them():
    p = FakeP()
    fence, alloc, registry = make(p, confirm_timeout_s=0.2, held_retry_s=0.05)
    try:
        fence.hold("p:1", "r1", alloc.allocate(4))
        wait_for(lambda: fence.counts["held"] == 4)
        assert alloc.num_available() == 4  # never handed to another request
        assert metric(registry, "pdorch_decode_fence_held_pages") == 4
        assert metric(registry, "pdorch_decode_fenced_pages_total", outcome="held") == 4
        p.answer = "confirmed"
        wait_for(lambda: alloc.num_available() == 8)
        assert fence.counts["confirmed_late"] == 4 and fence.counts["confirmed"] == 0
        assert metric(registry, "pdorch_decode_fence_held_pages") == 0
    finally:
        fence.stop()


def test_a_failing_confirmation_counts_as_not_yet():
    calls = []

    def broken(address, request_id):
        calls.append(request_id)
        if len(calls) < 3:
            raise RuntimeError("bug")
        return "confirmed"

    alloc = PageAllocator(4)
    fence = PageFence(alloc.release, broken, CollectorRegistry(), retry_s=0.02)
    try:
        fence.hold("p:1", "r1", alloc.allocate(2))
        wait_for(lambda: alloc.num_available() == 4)
        assert len(calls) == 3
    finally:
        fence.stop()
