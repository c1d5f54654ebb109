"""The push phase of a prefill task: its computed prompt pages into D's pool, and the answer.

    start(task)     scheduler thread, once the first token is sampled: PUSHING, the PUSH lease taken,
                    the pages D does not read from the store itself handed to the pusher's threads
    (pusher thread) the transfer returns: the caller is answered at once (task.succeed), then the
                    scheduler hears of it (a `Pushed` message)
    pushed(msg)     scheduler thread (the scheduler routes `Pushed` here): the PUSH lease given back;
                    DONE, or FAILED when the transfer failed; the scheduler then releases the pages
                    once no other I/O holds them

The only module that moves a task to PUSHING and DONE (`PrefillTask.advance`, prefill_node/task.py):
this phase's completion comes back here, with the lease it took.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import Counter

from pdorch.worker.errors import PeerFailed
from pdorch.worker.prefill_rpc import PrefillResult
from prefill_node import spans
from prefill_node.leases import PUSH
from prefill_node.messages import Pushed
from prefill_node.task import Phase, PrefillTask


class PushPhase:
    def __init__(self, rt, pusher, recorder, post: Callable[[Pushed], None]):
        """`post`: hands the `Pushed` message to the scheduler's loop (from the pusher thread)."""
        self._rt, self._pusher, self._rec, self._post = rt, pusher, recorder, post
        # what the KV push's span names as its transport (the transfer engine's protocol)
        self._transport = getattr(getattr(rt.peer_transfer, "transfer", None), "protocol", "") or "unknown"
        self._push_pages = Counter("pdorch_prefill_push_pages", "Prompt pages of finished prefills: pushed to D, "
                                   "or decode_loaded (D read them from the store itself)", ["kind"],
                                   registry=recorder.registry)

    def start(self, task: PrefillTask) -> None:
        """Push `task`'s pages to D (off this thread); the answer goes out when the transfer returns."""
        task.advance(Phase.PUSHING)
        task.io.take(PUSH)
        # Pages D reads from the store itself are not pushed (DecodeWorker, decode.load_prefix_from_store).
        held = set(task.job.decode_loaded_pages)
        send = [i for i in range(len(task.page_ids)) if i not in held]
        self._push_pages.labels("pushed").inc(len(send))
        self._push_pages.labels("decode_loaded").inc(len(held))
        try:
            self._pusher.push(task, self._rt.pool.page_addrs([task.page_ids[i] for i in send]),
                              [task.job.dest_page_addrs[i] for i in send], self._on_pushed)
        except BaseException:  # never started (pusher closed): no completion will give the pages back
            task.io.give_back(PUSH)
            raise

    def pushed(self, msg: Pushed) -> None:
        """Scheduler thread: the transfer of msg.task returned; its lease goes back and its phase ends."""
        task = msg.task
        task.io.give_back(PUSH)
        if msg.error is not None:
            if not task.finished_phase:
                task.fail(PeerFailed(f"KV transfer to decode worker failed: {msg.error}"))
                self._rec.request_failed(aborted=False)
        elif task.phase is Phase.PUSHING:
            task.advance(Phase.DONE)
            self._rec.request_finished()

    def _on_pushed(self, task: PrefillTask, err: Exception | None, nbytes: int, seconds: float) -> None:
        """Pusher thread: answer the caller right away, then let the scheduler release the pages."""
        try:
            spans.pushed(task, err, nbytes, seconds, self._transport)
            if err is None:
                self._rec.transfer(nbytes, seconds)
                task.succeed(self._result(task, nbytes, seconds))
        finally:  # whatever failed above, the scheduler must still hear of it or the pages leak
            self._post(Pushed(task, err))

    def _result(self, task: PrefillTask, nbytes: int, seconds: float) -> PrefillResult:
        compute, first = task.compute, task.compute.first
        assert first is not None, "the push starts once the first token is sampled"
        return PrefillResult(
            request_id=task.request_id, first_token_id=first.token_id, prompt_tokens=task.prompt_len,
            cached=task.cached(self._rt.page_size), transfer_bytes=nbytes, transfer_s=seconds,
            compute_s=compute.seconds, sampler_state=first.sampler_state,
            unstored_pages=tuple(task.persist.unstored), first_logprob=first.logprob, more_first=compute.more_first,
            prompt_logprobs=tuple(compute.prompt_logprobs[p] for p in sorted(compute.prompt_logprobs)))
