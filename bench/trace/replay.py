"""The open-loop replay: every planned request is sent at its due time through the router's
`/generate` (token ids, greedy, ignore_eos, exactly its output length; bench/multiturn/client.py),
whether or not earlier ones have answered. Only a request that follows the previous one of its
session (aiperf sessions, a Mooncake `delay`) waits for that one to end; a request that carries
its conversation sends the previous prompt + the previous answer's ids + its own.

Each request is timed as the client sees it: sent, first token (TTFT), the gaps between tokens, its
end; and it records what the response says it reused (meta_info: cached_tokens and the tier split).
Every request has a deadline (--timeout), so the replay ends within the trace's span plus that.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from bench.multiturn.client import HttpBackend
from bench.multiturn.conversation import Prompt
from bench.trace.plan import Planned


@dataclass
class Sent:
    """One replayed request, times in seconds since the replay's start."""

    position: int
    session: str
    prompt_ids: list[int]
    output_tokens: int                  # asked for
    sent_s: float = 0.0
    first_token_s: float | None = None  # sent_s + TTFT
    end_s: float | None = None
    prompt_tokens: int = 0              # the router's count (len(prompt_ids) when it says nothing)
    output_ids: list[int] = field(default_factory=list)
    cached_tokens: int = 0
    tiers: dict | None = None           # cached_tokens_details
    ttft_s: float | None = None
    itl_s: list = field(default_factory=list)
    error: str | None = None


class Replay:
    def __init__(self, plan: list[Planned], prompt_ids: list[list[int] | None], turn_ids: list[list[int]],
                 backend: HttpBackend, timeout_s: float, progress=None):
        """`prompt_ids[i]`: the whole prompt of a request that carries no history (None where it does);
        `turn_ids[i]`: its own part (what a history-carrying request appends)."""
        self.plan, self.prompt_ids, self.turn_ids = plan, prompt_ids, turn_ids
        self.backend, self.timeout_s, self.progress = backend, timeout_s, progress
        self.sent: list[Sent | None] = [None] * len(plan)
        self._done = [asyncio.Event() for _ in plan]
        self.t0 = 0.0

    def _now(self) -> float:
        return time.perf_counter() - self.t0

    async def run(self) -> list[Sent]:
        self.t0 = time.perf_counter()
        await asyncio.gather(*(self._one(i) for i in range(len(self.plan))))
        return [s for s in self.sent if s is not None]

    async def _one(self, i: int) -> None:
        p = self.plan[i]
        try:
            at = p.due_s if p.due_s is not None else 0.0
            ids = self.prompt_ids[i]
            if p.previous is not None:
                await self._done[p.previous].wait()
                prev = self.sent[p.previous]
                if prev is None:  # it never got as far as being sent
                    self.sent[i] = Sent(position=i, session=p.req.session, prompt_ids=[],
                                        output_tokens=p.output_tokens, sent_s=self._now(),
                                        error="the previous request of its session was not sent")
                    return
                at = max(at, (prev.end_s or self._now()) + p.delay_s)
                if p.req.carries_history:
                    ids = prev.prompt_ids + prev.output_ids + self.turn_ids[i]
            await asyncio.sleep(max(0.0, at - self._now()))
            self.sent[i] = s = Sent(position=i, session=p.req.session, prompt_ids=ids, output_tokens=p.output_tokens)
            s.sent_s = self._now()
            prompt = Prompt(client=i, round=0, ids=ids, messages=None, ideal_tokens=0, previous_context_pages=0)
            try:
                reply = await asyncio.wait_for(self.backend.send(prompt, p.output_tokens), self.timeout_s)
            except TimeoutError:
                s.end_s, s.error = self._now(), f"no answer within {self.timeout_s:g} s"
                return
            s.end_s = self._now()
            s.error, s.output_ids = reply.error, list(reply.output_ids or [])
            s.prompt_tokens = reply.prompt_tokens or len(ids)
            s.cached_tokens, s.tiers = reply.cached_tokens, reply.tiers
            s.ttft_s, s.itl_s = reply.ttft_s, list(reply.itl_s)
            s.first_token_s = None if reply.ttft_s is None else s.sent_s + reply.ttft_s
            if s.error is None and len(s.output_ids) != p.output_tokens:
                s.error = f"{len(s.output_ids)} output tokens, asked for {p.output_tokens}"
        finally:
            self._done[i].set()
            if self.progress is not None:
                self.progress.update(1)
