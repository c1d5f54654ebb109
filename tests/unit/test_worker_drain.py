"""WorkerDrain (pdorch/worker/drain.py): its gauges and the bounded write-back wait, with a small fake
worker (the steps themselves run on the real stack: tests/integration/test_local_fleet.py and
tests/integration/test_write_budget.py); DrainWrites (pdorch/worker/drain_writes.py): the chunks it
submits, how many at once, and what it counts."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry

from engine.page_allocator import LEFT_STORE, PENDING, PageAllocator
from pdorch.config_loader import load_config
from pdorch.worker.drain import WorkerDrain, drain_budget_s
from pdorch.worker.drain_writes import DrainWrites, WriteBackProgress, chunk_pages_for, still_unstored


class FakeWorker:
    def __init__(self, in_flight: int, pages: list[int], written_after_polls: int):
        self.in_flight_n, self.pages, self.polls, self.written_after = in_flight, pages, 0, written_after_polls

    def in_flight(self) -> int:
        return self.in_flight_n

    def start_write_back(self) -> int:
        return len(self.pages)

    def write_back_progress(self) -> WriteBackProgress:
        self.polls += 1
        n = len(self.pages)
        return WriteBackProgress(n, n) if self.polls >= self.written_after else WriteBackProgress(n, 1)


def gauges(registry) -> dict:
    return {(s.name, s.labels.get("kind")): s.value for m in registry.collect() for s in m.samples}


def test_gauges_are_zero_until_the_drain_begins_then_show_what_it_waits_for():
    registry = CollectorRegistry()
    drain = WorkerDrain("decode", FakeWorker(3, [1, 2], 2), registry)
    assert gauges(registry)[("pdorch_worker_draining", None)] == 0
    assert gauges(registry)[("pdorch_worker_drain_remaining", "streams")] == 0
    drain.begin()
    g = gauges(registry)
    assert g[("pdorch_worker_draining", None)] == 1
    assert g[("pdorch_worker_drain_remaining", "streams")] == 3
    assert g[("pdorch_worker_drain_remaining", "prefills")] == 0  # a decode worker runs none
    assert drain.write_back(5.0) == WriteBackProgress(2, 2)
    assert gauges(registry)[("pdorch_worker_drain_remaining", "writeback_pages")] == 0


def test_the_write_back_wait_ends_at_its_deadline_with_what_is_left():
    registry = CollectorRegistry()
    drain = WorkerDrain("prefill", FakeWorker(1, [1, 2, 3], 10 ** 9), registry)
    drain.begin()
    assert gauges(registry)[("pdorch_worker_drain_remaining", "prefills")] == 1
    t0 = time.monotonic()
    assert drain.write_back(0.3).left == 2
    assert 0.3 <= time.monotonic() - t0 < 2
    assert gauges(registry)[("pdorch_worker_drain_remaining", "writeback_pages")] == 2
    outcomes = {s.labels["outcome"]: s.value for m in registry.collect() for s in m.samples
                if s.name == "pdorch_worker_drain_writeback_pages_total"}
    assert outcomes == {"written": 1, "failed": 0, "skipped": 0, "late": 2}
    assert drain.write_back(0.0) == WriteBackProgress(0)  # drain_writeback_s 0: none


def test_drain_budget_covers_both_deadlines_and_the_shutdown():
    cfg = load_config(None, {"decode.drain_timeout_s": "7", "decode.drain_writeback_s": "3",
                             "prefill.drain_timeout_s": "2", "prefill.drain_writeback_s": "4"}, environ={})
    assert drain_budget_s(cfg, "decode") == 7 + 3 + 20
    assert drain_budget_s(cfg, "prefill") == 2 + 4 + 5


class FakeQueue:
    """What a worker's submit does with each chunk: the pages it still has to write (the others skipped)
    go to a queue that drops a save past its page budget, as store_client/io_thread.py does."""

    def __init__(self, budget: int, gone: set[str] = frozenset()):
        self.budget, self.gone, self.queued, self.chunks = budget, set(gone), [], []

    def submit(self, hashes: list[str]) -> int:
        pages = [h for h in hashes if h not in self.gone]
        if pages:
            assert sum(map(len, self.queued)) + len(pages) <= self.budget, "a chunk past the queue's budget"
            self.queued.append(pages)
            self.chunks.append(pages)
        return len(pages)


def test_drain_writes_go_a_few_chunks_at_a_time_within_the_queues_budget_and_count_what_landed():
    hashes = [f"h{i}" for i in range(600)]  # a full L1: one save of them all is past any default budget
    queue = FakeQueue(budget=256, gone={"h5"})
    writes = DrainWrites(hashes, queue.submit, chunk_pages_for(256))
    writes.start()
    assert len(queue.queued) == 2 and writes.progress().left == 600 - 1  # h5 left L1 meanwhile: skipped
    failed_once = False
    while queue.queued:
        chunk = queue.queued.pop(0)
        written = len(chunk) if failed_once else len(chunk) - 3  # one chunk's write fails for 3 pages
        failed_once = True
        writes.landed(written, len(chunk))
        assert len(queue.queued) <= 2
    assert [h for c in queue.chunks for h in c] == [h for h in hashes if h != "h5"]  # each once, in order
    assert writes.progress() == WriteBackProgress(600, written=596, failed=3, skipped=1)
    assert writes.progress().left == 0


def test_chunks_leave_half_of_a_small_budget_to_the_other_writes():
    assert chunk_pages_for(256) == 64
    assert chunk_pages_for(8) == 2  # two chunks queued: 4 of 8 pages
    assert chunk_pages_for(1) == 1


def test_a_drain_chunk_writes_only_the_pages_the_store_lacks_and_nobody_is_writing():
    """still_unstored: of the chunk's hashes, the cached pages neither stored, nor being written, nor
    dropped by the store's eviction on purpose; a hash no longer in L1 is skipped."""
    alloc = PageAllocator(8)
    pages = alloc.allocate(6)
    for i, p in enumerate(pages):
        alloc.cache(f"h{i}", p)
    alloc.mark_persisted([pages[0]])
    alloc.mark_unpersisted([pages[1]], PENDING)
    alloc.mark_left_store([pages[2]], LEFT_STORE)
    alloc.mark_unpersisted([pages[3]], "timeout")  # a failed write: the drain writes it again
    # pages[4]: never written (write-back off); pages[5]: written by another write while it waited
    alloc.mark_persisted([pages[5]])
    assert still_unstored(alloc, [f"h{i}" for i in range(6)] + ["gone"]) == [pages[3], pages[4]]
