"""PrefillStep: one forward of chunked prefill, batched across requests, and the first tokens.

Each call takes up to `prefill.chunk_tokens` prompt tokens FIFO across the computing tasks (oldest
first; a task's holes and tail are separate chunks of the same forward), runs one forward, and
samples the first token of every task whose last range it computed:

    task A  todo [[8, 12], [20, 30]]   budget 16 ->  chunks A[8:12], A[20:30], B[0:2]
    task B  todo [[0, 40]]                           (A finishes: its first token is sampled)

Each full page a forward completes joins L1 at once (its write-back waits for the task's end,
prefill_node/persistence.py): a request waiting for it (prefill_node/inflight.py) goes on before
this one ends. The forwards' recent cost per token (`seconds_per_token`) tells inflight.py what
computing a page here would cost.

Owns `task.compute` (ComputeState, prefill_node/task.py). Runs on the scheduler thread only.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from engine.model_runner import Chunk
from engine.page_allocator import pages_for
from engine.sampler import Sampler
from pdorch.worker.history import token_history
from pdorch.worker.prefill_rpc import FirstToken
from pdorch.worker.prompt_pages import compute_ranges, consume, take_ranges
from prefill_node.task import Phase, PrefillTask

if TYPE_CHECKING:
    from pdorch.worker.runtime import WorkerRuntime


class PrefillStep:
    def __init__(self, rt: WorkerRuntime, chunk_tokens: int, prefix_cache: bool):
        self._rt = rt
        self._chunk_tokens = chunk_tokens
        self._prefix_cache = prefix_cache
        self.seconds_per_token = 0.0  # the forwards' recent cost (an EMA), 0 = unknown

    def run(self, tasks: Iterable[PrefillTask]) -> list[PrefillTask] | None:
        """One forward over the computing tasks among `tasks`; the tasks it finished (their first
        tokens sampled), or None when none was computing."""
        batch = self._take_chunks([t for t in tasks if t.phase is Phase.COMPUTING])
        if not batch:
            return None
        page_size = self._rt.page_size
        chunks = [Chunk(page_ids=task.page_ids[:pages_for(end, page_size)], start_pos=start,
                        token_ids=list(task.job.token_ids[start:end])) for task, start, end in batch]
        t0, t0_mono = time.perf_counter(), time.monotonic()
        every = [task.job.params.prompt_logprobs is not None for task, _, _ in batch]
        with torch.inference_mode():
            if any(every):
                logits, rows = self._rt.runner.forward_every_row(chunks, every)
                for i, x in rows.items():
                    task, start, end = batch[i]
                    record_prompt_logprobs(task, start, end, x)
            else:
                logits = self._rt.runner.forward(chunks)
        elapsed = time.perf_counter() - t0
        total = sum(end - start for _, start, end in batch)
        self._observe(total, elapsed)
        stepped = list({id(t): t for t, _, _ in batch}.values())
        finished = []
        for task in stepped:
            if not task.compute.chunks:
                task.compute.started = t0_mono
            task.compute.chunks += 1
        for row, (task, start, end) in enumerate(batch):
            consume(self._todo(task), end)
            task.compute.seconds += elapsed * (end - start) / total
            if not task.compute.todo:
                finished.append((row, task))
        for task in stepped:  # pages complete now join L1 at once: requests parked for them go on
            self._cache_computed(task)
        if finished:
            self._sample_first(logits, finished)
        return [task for _, task in finished]

    def _observe(self, tokens: int, seconds: float) -> None:
        if tokens > 0:
            rate = seconds / tokens
            self.seconds_per_token = rate if not self.seconds_per_token else 0.8 * self.seconds_per_token + 0.2 * rate

    def _cache_computed(self, task: PrefillTask) -> None:
        """Cache in L1 the task's full pages computed so far. The ranges are computed in order, so a
        page is complete once the first range left starts at or past its end."""
        todo = task.compute.todo
        if not self._prefix_cache or todo is None:
            return
        page_size, alloc = self._rt.page_size, self._rt.allocator
        done_to = todo[0][0] if todo else task.prompt_len
        for i in task.computed_full_pages(page_size):
            if (i + 1) * page_size > done_to:
                break
            alloc.cache(task.prefix.hashes[i], task.page_ids[i])

    def _take_chunks(self, computing: list[PrefillTask]) -> list[tuple[PrefillTask, int, int]]:
        """(task, start, end) of each chunk of the next forward, oldest task first, within the budget."""
        computing.sort(key=lambda t: t.created)
        budget = self._chunk_tokens
        batch = []
        for task in computing:
            # NOTE: several ranges of one task may share a forward: the runner writes every chunk's
            # K/V of a layer before any chunk attends, so a later range sees an earlier one.
            for start, end in take_ranges(self._todo(task), budget):
                batch.append((task, start, end))
                budget -= end - start
        return batch

    def _todo(self, task: PrefillTask) -> list[list[int]]:
        """The task's ranges still to compute, planned at its first step (the prefix lookup has settled
        its holes by then): the holes, then the tail."""
        if task.compute.todo is None:
            task.compute.todo = compute_ranges(task.prefix.holes, task.prompt_len, self._rt.page_size)
        return task.compute.todo

    def _sample_first(self, logits: torch.Tensor, finished: list[tuple[int, PrefillTask]]) -> None:
        """The first token of each finished task, batched; a task with params.n > 1 gets n rows of
        its logits (sequence i: its own generator, seed + i, and a fork of the grammar)."""
        rows, params, grammars, histories, owners = [], [], [], [], []
        for row, t in finished:
            p = t.job.params
            history = token_history(self._rt.eos_token_ids, p, t.job.token_ids, t.prompt_len)
            forks = [t.grammar.fork() if t.grammar is not None else None for _ in range(p.n - 1)]
            for i, grammar in enumerate([t.grammar, *forks]):
                rows.append(row)
                params.append(p if p.n == 1 else p.sequence(i))
                grammars.append(grammar)
                histories.append(history)
                owners.append(t)
        x = logits[rows]
        gens = [self._rt.sampler.make_generator(p) for p in params]  # on the model's device
        tokens = self._rt.sampler.sample(x, params, gens, grammars, histories)
        logprobs = self._rt.sampler.logprobs(x, tokens, params)
        firsts: dict[int, list[FirstToken]] = {}
        for task, token, gen, lp in zip(owners, tokens, gens, logprobs):
            state = b"" if gen is None else gen.get_state().numpy().tobytes()
            firsts.setdefault(id(task), []).append(FirstToken(int(token), state, lp))
        for _, task in finished:
            task.compute.first, *more = firsts[id(task)]
            task.compute.more_first = tuple(more)


def record_prompt_logprobs(task: PrefillTask, start: int, end: int, logits: torch.Tensor) -> None:
    """The logprobs of prompt tokens start+1 .. end (each predicted by the row before it) from a chunk's
    every-row `logits`; the last prompt position predicts the first output token, not a prompt token."""
    stop = min(end, task.prompt_len - 1)
    if stop <= start:
        return
    params = task.job.params
    ask = replace(params, logprobs=params.prompt_logprobs)
    ids = list(task.job.token_ids[start + 1:stop + 1])
    for pos, lp in enumerate(Sampler.logprobs(logits[:stop - start], ids, [ask] * len(ids), ranks=True), start + 1):
        task.compute.prompt_logprobs[pos] = lp
