"""Variant (d) of `pdorch bench multiturn --compare`: the single-process engine (`engine.LLM`: one
KV pool with its L1 prefix cache, no disaggregation, no store) behind the same backend interface
as the HTTP clients, so the same conversations and timings apply.

One engine thread owns the LLM: it takes new prompts from a queue, runs `step()` while anything is
unfinished, and notes the time of every token; the asyncio side awaits a future per request.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time

from bench.multiturn.client import Reply
from bench.multiturn.conversation import Prompt


class EngineBackend:
    def __init__(self, model_dir, num_pages: int, page_size: int, output_tokens: int, api: str,
                 torch_threads: int, timeout_s: float):
        from engine.llm import LLM  # NOTE: lazy: torch loads only for this variant
        from engine.sampling_params import SamplingParams

        self.llm = LLM(model_dir, num_pages=num_pages, page_size=page_size, torch_threads=torch_threads)
        self.params = SamplingParams(temperature=0.0, max_tokens=output_tokens, ignore_eos=(api == "sglang"))
        self.api, self.timeout_s = api, timeout_s
        self.inbox: queue.Queue = queue.Queue()
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="engine", daemon=True)
        self._thread.start()

    async def send(self, prompt: Prompt) -> Reply:
        if self.error:
            return Reply(output_ids=[], error=self.error)
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self.inbox.put((prompt.ids, time.perf_counter(), loop, done))
        try:
            return await asyncio.wait_for(done, self.timeout_s)
        except TimeoutError:
            return Reply(output_ids=[], error=f"no answer within {self.timeout_s:.0f} s")

    async def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        active = {}  # Sequence -> (sent time, token times, loop, future)
        while not self._stop.is_set():
            try:
                while True:
                    ids, t0, loop, fut = self.inbox.get(block=not active, timeout=0.1)
                    active[self.llm.add_request(ids, self.params)] = (t0, [], loop, fut)
            except queue.Empty:
                pass
            if not active:
                continue
            try:
                self.llm.step()
            except Exception as e:  # noqa: BLE001 - fail what is in flight; later sends fail at once
                self.error = f"engine: {type(e).__name__}: {e}"[:200]
                for _, _, loop, fut in active.values():
                    loop.call_soon_threadsafe(_resolve, fut, Reply(output_ids=[], error=self.error))
                return
            now = time.perf_counter()
            for seq, (t0, times, loop, fut) in list(active.items()):
                times.extend([now] * (len(seq.output_ids) - len(times)))
                if seq.is_finished:
                    del active[seq]
                    loop.call_soon_threadsafe(_resolve, fut, self._reply(seq, t0, times))

    def _reply(self, seq, t0: float, times: list[float]) -> Reply:
        out = list(seq.output_ids)
        eos = set(self.llm.eos_token_ids)
        text = self.llm.tokenizer.decode([t for t in out if t not in eos], skip_special_tokens=True)
        finish = "length" if seq.finish_reason == "length" else "stop"
        return Reply(output_ids=out if self.api == "sglang" else None, text=text, prompt_tokens=seq.prompt_len,
                     completion_tokens=len(out), cached_tokens=seq.num_cached_tokens,
                     tiers={"device": seq.num_cached_tokens, "host": 0, "store": 0}, finish_reason=finish,
                     ttft_s=times[0] - t0 if times else None, itl_s=[b - a for a, b in itertools.pairwise(times)])


def _resolve(fut: asyncio.Future, reply: Reply) -> None:
    if not fut.done():
        fut.set_result(reply)
