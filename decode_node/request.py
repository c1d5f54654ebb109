"""DecodeRequest: the decode worker's request object and the events it streams.

It owns the token ids (prompt + generated), its pages (`req.pages`, RequestPages: written by the
scheduler and preemption only, read by everyone as `req.page_ids`), the hash chain of its full pages,
what is left of its KV to compute here (`req.compute`, LocalCompute: prompt pages, or pages a resume could
not read back) and the per-request stop checker. Handler threads create it and read `events`; after the prefill it
belongs to the scheduler thread until it finishes. What preemption keeps on it is one record,
`req.preempt` (PreemptState), changed by decode_node/preemption.py only.
"""

from __future__ import annotations

import queue
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from opentelemetry.context import Context

from engine.sampler import TokenCounts
from engine.sampling_params import SamplingParams
from pdorch.worker.leases import IOLeases
from pdorch.worker.prefill_rpc import CachedTokens

if TYPE_CHECKING:  # NOTE: only its type: engine.grammar is imported by whoever compiles a grammar
    from engine.grammar import OutputGrammar


@dataclass(frozen=True)
class DecodeEvent:
    """One chunk of the Generate stream (tokens since the previous chunk), or the error that ended it."""

    token_ids: tuple[int, ...] = ()
    text: str = ""
    finish_reason: str = ""
    matched_stop: str = ""
    error: Exception | None = None
    logprobs: tuple = ()  # engine.sampler.TokenLogprob per token of token_ids (when asked for)
    preemptions: int = 0  # times preempted since the previous event (decode_node/preemption.py)
    paused_s: float = 0.0  # seconds the preemptions that ended since the previous event paused the stream
    paused: bool = False  # preempted just now: the stream pauses (no tokens; sent so the router keeps its client)
    index: int = 0  # which of the request's n sequences (params.n > 1) this event continues
    prompt_logprobs: tuple = ()  # TokenLogprob of prompt tokens 1 .. n-1, on the first event (when asked for)

    @property
    def final(self) -> bool:
        return bool(self.finish_reason) or self.error is not None


@dataclass(frozen=True)
class GenerateJob:
    request_id: str
    token_ids: tuple[int, ...]
    params: SamplingParams
    prefill_address: str
    timeout_s: float


@dataclass
class LocalCompute:
    """The KV this worker computes itself before a request decodes: a work list set by a plan and
    worked off by the batch. Planned only while the batch does not run the request: by the prompt
    plan before it joins (PromptPlan.apply, decode_node/prompt_plan.py) or by a resume
    (decode_node/preemption.py); worked off only by the decode step (decode_node/step.py)."""

    todo: list[list[int]] = field(default_factory=list)  # token ranges [start, end) still to compute, in order
    pages: list[int] = field(default_factory=list)  # the full pages among them: to the store once computed
    first_pending: bool = False  # the first token is still to sample here (local prefill), not from P

    def plan(self, todo: list[list[int]], pages: list[int], sample_first: bool = False) -> None:
        """Compute `todo` (its full pages: `pages`) before decoding; `sample_first`: then sample the
        first token here (a local prefill)."""
        self.todo, self.pages = todo, pages
        if sample_first:
            self.first_pending = True

    def take_pages(self) -> list[int]:
        """The computed full pages, once (they go to the store)."""
        pages, self.pages = self.pages, []
        return pages


@dataclass
class PreemptState:
    """What preemption (decode_node/preemption.py, its only writer) keeps on a request: how often it
    was preempted; while preempted, the pages it keeps (its partial last page), the pages it gives
    back once no offload write reads them (parked) and since when it waits; while resuming, that its
    KV is being restored (pages read or recomputed before it decodes again); and the paused seconds
    its stream has not been told of yet (each preemption itself is told at once: the `paused` event).
    Kept apart so the scheduler only reads it."""

    count: int = 0
    kept_pages: list[int] = field(default_factory=list)
    parked_pages: list[int] = field(default_factory=list)
    paused_since: float | None = None
    resuming: bool = False
    unreported_s: float = 0.0

    def take_unreported(self) -> float:
        """Paused seconds not streamed yet; the next event carries them."""
        unreported, self.unreported_s = self.unreported_s, 0.0
        return unreported


@dataclass
class RequestPages:
    """The pool pages a request holds: `ids`, its KV's pages by position (page k holds positions
    k*S .. k*S+S-1; the list grows in place by a page as decoding needs one), and `spare`, the pages
    admitted for its forks' copies of the last page (n > 1, decode_node/forks.py).

    One owner: only the scheduler (decode_node/scheduler.py: admission's grant, the handler's give
    back before the request joins, the page for the next position, the give back once it ended)
    and preemption (decode_node/preemption.py: preempt, resume) call these methods; every other
    module reads `req.page_ids`."""

    _ids: list[int] = field(default_factory=list)
    _spare: list[int] = field(default_factory=list)

    @property
    def ids(self) -> Sequence[int]:
        return self._ids

    def grant(self, ids: Iterable[int], spare: Iterable[int]) -> None:
        """Admission's answer: the prompt's pages (and the forks' spare ones)."""
        self._ids, self._spare = list(ids), list(spare)

    def reset(self, ids: Iterable[int]) -> None:
        """Its KV's pages are `ids` now (a fork placed, a resume, a preempted request ending); what it
        held before was given back or is among them."""
        self._ids = list(ids)

    def extend(self, ids: Iterable[int]) -> None:
        """Pages for the positions after its last page (in place: a step's page tables keep the list)."""
        self._ids.extend(ids)

    def take(self) -> list[int]:
        """Every page of its KV, leaving it none (they go back to the pool or to the fence)."""
        ids, self._ids = self._ids, []
        return ids

    def take_all(self) -> list[int]:
        """Its KV's pages and its spare ones, leaving it none."""
        ids, self._ids, self._spare = self._ids + self._spare, [], []
        return ids

    def take_spare(self) -> int:
        """One spare page (a fork's copy of the last page)."""
        return self._spare.pop()

    def drop(self, gone: Iterable[int]) -> None:
        """`gone` are not its any more (an abandoned store read's: the scheduler frees them)."""
        out = set(gone)
        self._ids = [p for p in self._ids if p not in out]


@dataclass(eq=False)
class DecodeRequest:
    job: GenerateJob
    deadline: float  # time.monotonic() value
    own_deadline: bool  # the caller gave timeout_s (else decode.request_timeout_s made `deadline`)
    stopper: object  # engine stop checker (see decode_node/stopping.py)
    token_ids: list[int] = field(default_factory=list)
    pages: RequestPages = field(default_factory=RequestPages)  # its pool pages: see RequestPages for who writes
    page_hashes: list[str] = field(default_factory=list)  # full pages, prompt first, then decoded ones
    cached: CachedTokens = field(default_factory=CachedTokens)
    generator: object = None
    grammar: OutputGrammar | None = None  # advanced by every token (P's first one too)
    token_counts: TokenCounts = field(default_factory=TokenCounts)  # what the penalties read (engine/sampler.py)
    cancelled: bool = False
    handoff: bool = False  # draining: end the stream UNAVAILABLE so the router resumes it elsewhere
    done: bool = False  # answered (finished, failed or aborted); pages go back once it holds no I/O lease
    io: IOLeases = field(default_factory=IOLeases)  # step writes still reading page_ids (decode_node/step_writes.py)
    l1_pages: tuple[int, ...] = ()  # reusable prompt pages found in this worker's own prefix cache
    inflight_pages: int = 0  # of those, the pages it waited for while another request filled them
    unstored_pages: tuple[int, ...] = ()  # pages P pushed but does not write to the store
    compute: LocalCompute = field(default_factory=LocalCompute)
    arrival: int = 0  # the order it joined the batch in (the scheduler's; preemption's victim is the latest)
    preempt: PreemptState = field(default_factory=PreemptState)
    events: queue.Queue = field(default_factory=queue.Queue)
    # n > 1 (decode_node/forks.py): sequence `index` of its request. The first sequence owns the
    # forks; they share its events queue, the prompt's full pages and its deadline.
    index: int = 0
    forks: list[DecodeRequest] = field(default_factory=list)
    # The decode.generate RPC's span (pdorch/tracing/grpc_server.py): every span of the request is its
    # child (decode_node/spans.py); None when not traced. Forks (n > 1) carry none.
    trace_ctx: Context | None = None
    arrived_ns: int = 0  # unix ns when the Generate call was created here (decode.first_token's start)

    @property
    def request_id(self) -> str:
        return self.job.request_id

    @property
    def page_ids(self) -> Sequence[int]:
        """Its KV's pool pages by position (read only: `pages` changes them)."""
        return self.pages.ids

    @property
    def prompt_len(self) -> int:
        return len(self.job.token_ids)

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def sequences(self) -> list[DecodeRequest]:
        """This request and its forks (n > 1)."""
        return [self, *self.forks]

    def emit(self, event: DecodeEvent) -> None:
        if self.index:
            event = replace(event, index=self.index)
        paused_s = self.preempt.take_unreported()
        if paused_s:  # the first event after a resume says how long the stream paused
            event = replace(event, paused_s=event.paused_s + paused_s)
        if not self.done:
            self.events.put(event)
            if event.final:
                self.done = True
