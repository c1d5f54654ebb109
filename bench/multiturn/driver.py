"""The load loop of `pdorch bench multiturn`: N conversations x R rounds through one backend.

    dispatcher: takes ready (conversation, round) pairs in order, waits an exponential gap when
                --request-rate is finite (Poisson arrivals), starts the request; at most
                --max-parallel are in flight.
    ready:      with the round barrier, all conversations' round r once every round r-1 answer is
                in (and `on_round_end(r-1)` returned: counters, RSS, an optional L1 flush);
                without it, a conversation's next round as soon as its own answer is in.

Every request has the backend's deadline, so the loop ends within rounds x that deadline.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time

from bench.multiturn.client import Reply
from bench.multiturn.stats import RequestResult


class RoundLoop:
    def __init__(self, conversations, backend, rounds: int, max_parallel: int, request_rate: float,
                 barrier: bool, seed: int, on_round_end, progress=None, stall_timeout_s: float = 900.0):
        self.convs, self.backend, self.rounds = conversations, backend, rounds
        self.max_parallel, self.request_rate, self.barrier = max_parallel, request_rate, barrier
        self.rng = random.Random(f"arrivals:{seed}")
        self.on_round_end = on_round_end  # async fn(round_index, results of the round)
        self.progress = progress
        self.stall_timeout_s = stall_timeout_s  # longest wait for the next ready request
        self.results: dict[int, list[RequestResult]] = {r: [] for r in range(rounds)}
        self.round_span: dict[int, list[float]] = {}  # round -> [first start, last end] (s since t0)
        self.prompt_mismatches = 0
        self.t0 = time.perf_counter()

    async def run(self) -> dict[int, list[RequestResult]]:
        self.t0 = time.perf_counter()
        self._ready: asyncio.Queue = asyncio.Queue()
        self._left = {r: len(self.convs) for r in range(self.rounds)}
        self._round_done = {r: asyncio.Event() for r in range(self.rounds)}
        self._sem = asyncio.Semaphore(self.max_parallel)
        feeder = asyncio.create_task(self._feed())
        tasks = []
        try:
            for _ in range(len(self.convs) * self.rounds):
                for t in tasks + [feeder]:
                    if t.done() and t.exception() is not None:
                        raise t.exception()
                try:
                    conv, r = await asyncio.wait_for(self._ready.get(), self.stall_timeout_s)
                except TimeoutError:
                    raise RuntimeError(f"no request became ready within {self.stall_timeout_s:.0f} s") from None
                if self.request_rate != float("inf"):
                    await asyncio.sleep(self.rng.expovariate(self.request_rate))
                tasks.append(asyncio.create_task(self._one(conv, r)))
            await asyncio.gather(*tasks)
            await feeder
        finally:
            for t in tasks + [feeder]:
                t.cancel()
        return self.results

    async def _feed(self) -> None:
        if not self.barrier:
            for conv in self.convs:
                self._ready.put_nowait((conv, 0))
            return
        for r in range(self.rounds):
            for conv in self.convs:
                self._ready.put_nowait((conv, r))
            await self._round_done[r].wait()

    async def _one(self, conv, r: int) -> None:
        prompt = conv.next_prompt(r)
        async with self._sem:
            start = time.perf_counter() - self.t0
            try:
                reply = await self.backend.send(prompt)
            except Exception as e:  # noqa: BLE001 - a broken request must not stall the other clients
                reply = Reply(output_ids=None, error=f"{type(e).__name__}: {e}"[:200])
            end = time.perf_counter() - self.t0
        conv.record_answer(reply.output_ids, reply.text, reply.completion_tokens, reply.finish_reason)
        if reply.error is None and reply.prompt_tokens and reply.prompt_tokens != len(prompt.ids):
            self.prompt_mismatches += 1  # the ideal assumes the ids we rendered are the ids sent
            if self.prompt_mismatches == 1:
                print(f"warning: the server counted {reply.prompt_tokens} prompt tokens, we sent "
                      f"{len(prompt.ids)} (client {conv.client}, round {r})", file=sys.stderr)
        self.results[r].append(RequestResult(
            client=conv.client, round=r, prompt_tokens=len(prompt.ids), ideal_tokens=prompt.ideal_tokens,
            previous_context_pages=prompt.previous_context_pages, cached_tokens=reply.cached_tokens,
            tiers=reply.tiers, output_tokens=reply.completion_tokens, ttft_s=reply.ttft_s, itl_s=reply.itl_s,
            start_s=start, end_s=end, error=reply.error))
        span = self.round_span.setdefault(r, [start, end])
        span[0], span[1] = min(span[0], start), max(span[1], end)
        if self.progress is not None:
            self.progress.update(1)
        self._left[r] -= 1
        if self._left[r] == 0:
            try:
                await self.on_round_end(r, self.results[r])
            finally:  # NOTE: even if it failed, or the barrier would wait for ever
                self._round_done[r].set()
        if not self.barrier and r + 1 < self.rounds:
            self._ready.put_nowait((conv, r + 1))
