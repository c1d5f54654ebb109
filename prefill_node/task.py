"""PrefillTask: the prefill worker's request object (owns its token ids, pages, hashes, progress).

Lifecycle on the scheduler thread:

    WAITING --pages allocated, L1 matched--> LOADING (store read in flight, optional)
            --> COMPUTING (uncached tail, in chunks) --> PUSHING (transfer to D, off-thread)
            --> DONE (answered; pages may still be held by a store write-back)

A task holds references on its pages from allocation until it is DONE or FAILED *and* no I/O
(store load/save, transfer) still reads or writes them; only then does the scheduler release them.
"""

from __future__ import annotations

import concurrent.futures
import enum
import time
from dataclasses import dataclass, field

from prefill_node.job import CachedTokens, PrefillJob, PrefillResult


class Phase(enum.Enum):
    WAITING = "waiting"
    LOADING = "loading"
    COMPUTING = "computing"
    PUSHING = "pushing"
    DONE = "done"
    FAILED = "failed"


def reusable_pages(prompt_len: int, page_size: int) -> int:
    """How many leading pages may come from a cache: full pages only, and never the one holding
    the last prompt token, because its logits must be computed to sample the first token.

        prompt_len=40, page_size=16:  |page0 full|page1 full|page2 8/16|  -> 2 (page2 is partial)
        prompt_len=32, page_size=16:  |page0 full|page1 full|           -> 1 (page1 has the last token)
    """
    return (prompt_len - 1) // page_size


@dataclass(eq=False)
class PrefillTask:
    job: PrefillJob
    deadline: float  # time.monotonic() value
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    phase: Phase = Phase.WAITING
    page_ids: list[int] = field(default_factory=list)
    page_hashes: list[str] = field(default_factory=list)  # full prompt pages only
    num_computed_tokens: int = 0
    device_pages: int = 0  # leading pages matched in L1
    store_pages: int = 0  # pages after those, loaded from the store
    io_pending: int = 0  # store loads/saves and transfers still touching page_ids
    first_token_id: int = -1
    sampler_state: bytes = b""
    compute_s: float = 0.0
    created: float = field(default_factory=time.monotonic)

    @property
    def request_id(self) -> str:
        return self.job.request_id

    @property
    def prompt_len(self) -> int:
        return len(self.job.token_ids)

    @property
    def cached(self) -> CachedTokens:
        page_size = self.job.page_size
        return CachedTokens(device=self.device_pages * page_size, host=0, store=self.store_pages * page_size)

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

    def succeed(self, result: PrefillResult) -> bool:
        """Answer with `result` unless the task already failed (e.g. aborted during the push)."""
        if self.future.done():
            return False
        try:
            self.future.set_result(result)
        except concurrent.futures.InvalidStateError:
            return False
        return True
