"""PrefillTask: the prefill worker's request object (owns its token ids, pages, hashes, progress).

Lifecycle on the scheduler thread:

    WAITING --pages allocated, L1 matched--> LOADING (store read in flight, optional; the
            prefetch policy may stop waiting for it: prefill_node/prefetch.py)
            --> COMPUTING (uncached tail, in chunks) --> PUSHING (transfer to D, off-thread)
            --> DONE (answered; pages may still be held by a store write-back)

A task holds references on its pages from allocation until it is DONE or FAILED *and* no I/O
(store load/save, transfer) still reads or writes them; only then does the scheduler release them.

The push gate (pusher thread vs gRPC handler threads) guards D's pages, not ours: once
`stop_pushes()` ran no transfer of the task can start (the push into D's pages, or a read of the
prefix pages D holds), and it returns True only when none is running, so nothing touches D's
pages any more (docs/workers.md, "Fencing D's pages").
"""

from __future__ import annotations

import concurrent.futures
import enum
import threading
import time
from dataclasses import dataclass, field

from pdorch.worker.prefill_rpc import CachedTokens, PrefillJob, PrefillResult
from pdorch.worker.prompt_pages import compute_ranges, computed_full_pages


class Phase(enum.Enum):
    WAITING = "waiting"
    LOADING = "loading"
    COMPUTING = "computing"
    PUSHING = "pushing"
    DONE = "done"
    FAILED = "failed"


@dataclass(eq=False)
class PrefillTask:
    job: PrefillJob
    deadline: float  # time.monotonic() value
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    phase: Phase = Phase.WAITING
    page_ids: list[int] = field(default_factory=list)
    page_hashes: list[str] = field(default_factory=list)  # full prompt pages only
    # Token ranges [start, end) still to compute, in order: the holes (reusable pages found neither
    # in L1 nor in the store), then the uncached tail. Each range attends to every page before it.
    #     pages   | L1 | store | hole | store | tail... |
    #     todo    [        [hole start, end), [tail start, prompt_len)]
    todo: list[list[int]] = field(default_factory=list)
    device_pages: int = 0  # reusable pages found in L1
    store_pages: int = 0  # reusable pages loaded from the store's DRAM
    ssd_pages: int = 0  # reusable pages loaded from the store's SSD tier
    decode_pages: int = 0  # reusable pages read from the decode worker's pool (its prefix cache)
    holes: list[int] = field(default_factory=list)  # reusable pages neither tier had: recomputed
    loading: list[int] = field(default_factory=list)  # page indexes of the store load in flight
    reading: list[int] = field(default_factory=list)  # page indexes of the read from D's pool in flight
    loads_left: int = 0  # of those two, the ones not completed yet
    store_load_open: bool = False  # its store load runs and the task waits for it (prefetch.py)
    wait_load_until: float = float("inf")  # prefetch policy timeout: when it stops waiting for it
    late: list[tuple[int, int]] = field(default_factory=list)  # (index, page) of the store load it gave up on
    given_up_pages: int = 0  # of the holes, the pages of that load (computed in fresh pages)
    missed: list[int] = field(default_factory=list)  # pages the completed ones could not give
    backfill: list[int] = field(default_factory=list)  # L1 hits the store lacks: written with the write-back
    unstored: list[int] = field(default_factory=list)  # computed pages not written (the store would evict them)
    pages_short: int = 0  # when admission failed: pages missing without dropping unpersisted ones
    paced_since: float | None = None  # when it began waiting for another task's store I/O to admit
    io_pending: int = 0  # store loads/saves and transfers still touching page_ids
    first_token_id: int = -1
    sampler_state: bytes = b""
    grammar: object = None  # engine.grammar.OutputGrammar: the first token is sampled under it
    first_logprob: object = None  # engine.sampler.TokenLogprob, when the request asked for logprobs
    more_first: tuple = ()  # pdorch.worker.prefill_rpc.FirstToken of sequences 1 .. n-1 (params.n > 1)
    prompt_logprobs: dict = field(default_factory=dict)  # position -> TokenLogprob (params.prompt_logprobs)
    compute_s: float = 0.0
    created: float = field(default_factory=time.monotonic)
    gate: threading.Condition = field(default_factory=threading.Condition)
    transfers: int = 0  # transfers touching D's pages running now: the push, a read (under `gate`)
    pushes_over: bool = False  # no transfer can start any more (under `gate`)

    @property
    def request_id(self) -> str:
        return self.job.request_id

    @property
    def prompt_len(self) -> int:
        return len(self.job.token_ids)

    @property
    def cached(self) -> CachedTokens:
        """NOTE: pages read from D's pool count as `device`: they come from a device KV pool (D's)."""
        page_size = self.job.page_size
        return CachedTokens(device=(self.device_pages + self.decode_pages) * page_size, host=0,
                            store=self.store_pages * page_size, ssd=self.ssd_pages * page_size)

    def computed_full_pages(self) -> list[int]:
        """Indexes of the full pages computed here: the holes, then the tail's full page if any."""
        return computed_full_pages(self.holes, self.prompt_len, self.job.page_size)

    @property
    def computed_tokens(self) -> int:
        """Prompt tokens computed here (holes + tail)."""
        reused = self.device_pages + self.store_pages + self.ssd_pages + self.decode_pages
        return self.prompt_len - reused * self.job.page_size

    def plan_compute(self, holes: list[int]) -> None:
        """Set `todo` from the hole pages (sorted) and the tail."""
        self.todo = compute_ranges(holes, self.prompt_len, self.job.page_size)
        self.holes = list(holes)
        self.phase = Phase.COMPUTING

    @property
    def finished_phase(self) -> bool:
        return self.phase in (Phase.DONE, Phase.FAILED)

    def fail(self, err: Exception) -> None:
        """Answer the caller with `err` (first answer wins); pages are released later, when idle."""
        self.phase = Phase.FAILED
        if not self.future.done():
            try:
                self.future.set_exception(err)
            except concurrent.futures.InvalidStateError:
                pass

    def begin_push(self) -> bool:
        """Pusher thread: may a transfer touching D's pages (the push, or a read) start? Not once the
        task was answered or its pushes stopped."""
        with self.gate:
            if self.pushes_over or self.future.done():
                return False
            self.transfers += 1
            return True

    def end_push(self, last: bool = True) -> None:
        """Pusher thread: a transfer begun by begin_push returned (succeeded or failed). `last`: it was
        the push, after which nothing of this task touches D's pages again."""
        with self.gate:
            self.transfers -= 1
            self.pushes_over = self.pushes_over or last
            self.gate.notify_all()

    def stop_pushes(self, timeout_s: float) -> bool:
        """No transfer starts from now on; True once none is running (waits up to timeout_s for it).

        NOTE: a transfer is one synchronous batch call: when it has returned, every byte of it has
        landed or never will, so "returned" is what D may rely on."""
        with self.gate:
            self.pushes_over = True
            return self.gate.wait_for(lambda: self.transfers == 0, timeout_s)

    @property
    def writes_over(self) -> bool:
        """True when nothing of this task can still touch D's pages (its transfers ended or never will)."""
        with self.gate:
            return self.pushes_over and self.transfers == 0

    def succeed(self, result: PrefillResult) -> bool:
        """Answer with `result` unless the task already failed (e.g. aborted during the push)."""
        if self.future.done():
            return False
        try:
            self.future.set_result(result)
        except concurrent.futures.InvalidStateError:
            return False
        return True
