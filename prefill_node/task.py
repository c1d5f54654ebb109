"""PrefillTask: the prefill worker's request object, a small core plus one state record per owner.

Lifecycle on the scheduler thread:

    WAITING --pages allocated, L1 matched--> LOADING (store read in flight, optional; the
            prefetch policy may stop waiting for it: prefill_node/prefetch.py)
            --> COMPUTING (uncached tail, in chunks) --> PUSHING (transfer to D, off-thread)
            --> DONE (answered; pages may still be held by a store write-back)

The core is the lifecycle the scheduler drives on its thread: `phase` (written here only: `advance`
checks each move against the lifecycle above, called by the module that owns the phase it enters,
prefill_node/admission.py LOADING and COMPUTING, prefill_node/push_phase.py PUSHING and DONE; `fail`
FAILED), `page_ids` (allocated by prefix.py, which also swaps a given-up load's pages for fresh
ones, released by scheduler.py), `io` (leases taken and given back only in the module that owns
the I/O), `future` (answered once by `fail` / `succeed`). Every other field sits in the record of
the one module that changes it (a record's fields are assigned only there; others only read them):

    task.prefix   PrefixState   prefill_node/prefix.py       where each reusable page came from
    task.load     LoadWait      prefill_node/admission.py    waiting for (or giving up on) the store load
    task.inflight InFlightState prefill_node/inflight.py     waiting for another task's pages
    task.persist  PersistState  prefill_node/persistence.py  what the store was not asked to hold
    task.compute  ComputeState  prefill_node/step.py         the ranges left, the first tokens sampled
    task.push     PushGate      prefill_node/push_gate.py    the fence on D's pages (pusher, gRPC threads)

A task holds references on its pages from allocation until it is DONE or FAILED *and* holds no I/O
lease (`task.io`, prefill_node/leases.py: store load/save, read from D, push); only then does the
scheduler release them.
"""

from __future__ import annotations

import concurrent.futures
import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from opentelemetry.context import Context

from pdorch.worker.leases import IOLeases
from pdorch.worker.prefill_rpc import CachedTokens, FirstToken, PrefillJob, PrefillResult
from pdorch.worker.prompt_pages import computed_full_pages
from prefill_node.push_gate import PushGate

if TYPE_CHECKING:  # engine.grammar loads xgrammar; tasks are made by light tests too
    from engine.grammar import OutputGrammar


class Phase(enum.Enum):
    WAITING = "waiting"
    LOADING = "loading"
    COMPUTING = "computing"
    PUSHING = "pushing"
    DONE = "done"
    FAILED = "failed"


# The moves `PrefillTask.advance` allows (FAILED is entered by `fail`, from any phase).
NEXT_PHASES = {
    Phase.WAITING: (Phase.LOADING, Phase.COMPUTING),
    Phase.LOADING: (Phase.COMPUTING,),
    Phase.COMPUTING: (Phase.PUSHING,),
    Phase.PUSHING: (Phase.DONE,),
}


class PhaseError(RuntimeError):
    """A task moved to a phase its lifecycle does not allow from where it is (a bug)."""


@dataclass(eq=False)
class PrefixState:
    """Owner: prefill_node/prefix.py (L1 lookup and the plan; the completions of the store load and the
    read from D that admission.py starts). Page indexes are into the prompt's pages.

        pages   | L1 | store | hole | store | tail... |
        holes                  [hole]                      (computed here, before the tail)
    """

    hashes: list[str] = field(default_factory=list)  # full prompt pages only
    device_pages: int = 0  # reusable pages found in L1
    inflight_pages: int = 0  # of L1's, pages another request was computing when this one arrived (inflight.py)
    store_pages: int = 0  # reusable pages loaded from the store's DRAM
    ssd_pages: int = 0  # reusable pages loaded from the store's SSD tier
    decode_pages: int = 0  # reusable pages read from the decode worker's pool (its prefix cache)
    holes: list[int] = field(default_factory=list)  # reusable pages neither tier had: recomputed
    loading: list[int] = field(default_factory=list)  # page indexes of the store load in flight
    reading: list[int] = field(default_factory=list)  # page indexes of the read from D's pool in flight
    loads_left: int = 0  # of those two, the ones not completed yet
    missed: list[int] = field(default_factory=list)  # pages the completed ones could not give
    miss_reasons: dict[int, str] = field(default_factory=dict)  # page index -> why it was not reused (traces)
    backfill: list[int] = field(default_factory=list)  # L1 hits the store lacks: written with the write-back
    pages_short: int = 0  # when admission failed: pages missing without dropping unpersisted ones

    @property
    def reused_pages(self) -> int:
        return self.device_pages + self.inflight_pages + self.store_pages + self.ssd_pages + self.decode_pages


@dataclass(eq=False)
class LoadWait:
    """Owner: prefill_node/admission.py (the store load; how long it is waited for: prefetch.py's policy)."""

    open: bool = False  # its store load runs and the task waits for it
    wait_until: float = float("inf")  # policy timeout: when it stops waiting for it
    late: list[tuple[int, int]] = field(default_factory=list)  # (index, page) of the store load it gave up on
    given_up_pages: int = 0  # of the holes, the pages of that load (computed in fresh pages)


@dataclass(eq=False)
class InFlightState:
    """Owner: prefill_node/inflight.py (waiting for another task's pages)."""

    waited_for: frozenset[str] = frozenset()  # hashes it waited for while parked (parks at most once)
    parked: bool = False  # waiting for them now (out of the admission queue)


@dataclass(eq=False)
class PersistState:
    """Owner: prefill_node/persistence.py (the task's write-back)."""

    unstored: list[int] = field(default_factory=list)  # computed pages not written (D is told)


@dataclass(eq=False)
class ComputeState:
    """Owner: prefill_node/step.py (chunked forwards, first-token sampling)."""

    # Token ranges [start, end) still to compute, in order: the holes, then the uncached tail. Each
    # range attends to every page before it. None until the task's first step plans them.
    todo: list[list[int]] | None = None
    seconds: float = 0.0  # this task's share of the forwards' time
    chunks: int = 0  # the forwards that computed a chunk of it
    started: float = 0.0  # time.monotonic() of its first forward
    prompt_logprobs: dict = field(default_factory=dict)  # position -> TokenLogprob (params.prompt_logprobs)
    first: FirstToken | None = None  # sequence 0's first token
    more_first: tuple = ()  # FirstToken of sequences 1 .. n-1 (params.n > 1)


@dataclass(eq=False)
class PrefillTask:
    job: PrefillJob
    deadline: float  # time.monotonic() value
    grammar: OutputGrammar | None = None  # the first token is sampled under it
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    phase: Phase = Phase.WAITING
    page_ids: list[int] = field(default_factory=list)
    io: IOLeases = field(default_factory=IOLeases)  # store loads/saves and transfers touching page_ids
    created: float = field(default_factory=time.monotonic)
    prefix: PrefixState = field(default_factory=PrefixState)
    load: LoadWait = field(default_factory=LoadWait)
    inflight: InFlightState = field(default_factory=InFlightState)
    persist: PersistState = field(default_factory=PersistState)
    compute: ComputeState = field(default_factory=ComputeState)
    push: PushGate = field(init=False)
    # The prefill.prefill RPC's span (pdorch/tracing/grpc_server.py): every span of the task is its child.
    trace_ctx: Context | None = None
    admitted: float = 0.0  # time.monotonic() when its pages were allocated (the queue's end)

    def __post_init__(self):
        self.push = PushGate(self.future)

    @property
    def request_id(self) -> str:
        return self.job.request_id

    @property
    def prompt_len(self) -> int:
        return len(self.job.token_ids)

    def cached(self, page_size: int) -> CachedTokens:
        """NOTE: pages read from D's pool count as `device`: they come from a device KV pool (D's)."""
        p = self.prefix
        return CachedTokens(device=(p.device_pages + p.decode_pages) * page_size, host=0,
                            store=p.store_pages * page_size, ssd=p.ssd_pages * page_size,
                            inflight=p.inflight_pages * page_size)

    def computed_full_pages(self, page_size: int) -> list[int]:
        """Indexes of the full pages computed here: the holes, then the tail's full page if any."""
        return computed_full_pages(self.prefix.holes, self.prompt_len, page_size)

    def computed_tokens(self, page_size: int) -> int:
        """Prompt tokens computed here (holes + tail)."""
        return self.prompt_len - self.prefix.reused_pages * page_size

    @property
    def finished_phase(self) -> bool:
        return self.phase in (Phase.DONE, Phase.FAILED)

    def advance(self, phase: Phase) -> None:
        """Enter `phase`, the next one of the lifecycle (module docstring); any other move raises."""
        if phase not in NEXT_PHASES.get(self.phase, ()):
            raise PhaseError(f"prefill task {self.request_id}: {self.phase.value} -> {phase.value} is not a phase move")
        self.phase = phase

    def fail(self, err: Exception) -> None:
        """Answer the caller with `err` (first answer wins); pages are released later, when idle."""
        self.phase = Phase.FAILED
        if not self.future.done():
            try:
                self.future.set_exception(err)
            except concurrent.futures.InvalidStateError:
                pass

    def succeed(self, result: PrefillResult) -> bool:
        """Answer with `result` unless the task already failed (e.g. aborted during the push)."""
        if self.future.done():
            return False
        try:
            self.future.set_result(result)
        except concurrent.futures.InvalidStateError:
            return False
        return True
