"""The steps of a tensor-parallel worker: rank 0 broadcasts each pool-changing step, the follower
ranks do the same step on their shard (as SGLang's TP workers follow their scheduler's broadcast).

    rank 0 (scheduler thread)                   follower r (main thread, follow())
    GroupRunner.forward(chunks)
      lock; send(forward words) ------------->  receive -> runner.forward(chunks)
      runner.forward(chunks)  <-- all-reduce / gather inside the model (pg: NCCL on CUDA) -->
      unlock
    copy_page(src, dst)       ------------->    pool.tensor[dst] = pool.tensor[src]
    capture_decode_graphs     ------------->    the same captures, in lockstep (their NCCL calls too)
    (idle tp_timeout_s / 4)   (NOOP) ------->   (nothing: the collective's deadline starts again)
    close()                   (STOP) ------->   return

Steps travel as int64 words (pdorch/worker/tp_wire.py: page tables as deltas) over the group's CPU
(gloo) group, in one broadcast of STEP_WORDS words (a second one only for a longer step): no pickling,
no device copy, no NCCL call for the host's data.

One lock orders every collective of rank 0: the heartbeat thread never slips a broadcast between a
step's broadcast and the collectives of its forward. Every collective has the group's timeout, so a
rank that hangs or dies fails the others' next collective instead of stalling them: a follower
then exits, and rank 0 takes the worker down (`on_broken`), which pdorch serve / Kubernetes restart.
The heartbeat thread also watches the followers' processes (`dead_ranks`, without the lock): on NCCL
a dead peer leaves rank 0 inside a collective until the watchdog (minutes), so rank 0 goes down within
LIVENESS_POLL_S of a follower's exit instead, and its streams fail over at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

import torch

from engine.attention.batch import Chunk, check_chunks
from engine.model_runner import ModelRunner
from pdorch.worker.tp_wire import (
    CAPTURE,
    COPY_PAGE,
    FORWARD,
    FORWARD_EVERY_ROW,
    NOOP,
    STOP,
    StepDecoder,
    StepEncoder,
)

log = logging.getLogger(__name__)

STEP_WORDS = 2048  # the first broadcast's size: a decode step of up to ~340 rows fits in it
LIVENESS_POLL_S = 0.25  # how often rank 0's heartbeat looks for exited followers


class StepChannel:
    """Ordered steps from rank 0 to the followers over the TP group's CPU group (gloo broadcasts)."""

    def __init__(self, group, on_broken: Callable[[BaseException], None], heartbeat_s: float = 15.0,
                 dead_ranks: Callable[[], list[int]] | None = None, thread_init: Callable[[], None] | None = None):
        self.group, self.heartbeat_s = group, heartbeat_s  # rank 0 idle this long: one NOOP step
        self.lock = threading.Lock()  # held for a step's broadcast AND its collectives
        self._on_broken = on_broken
        self._dead_ranks = dead_ranks  # rank 0: the follower ranks whose process has exited
        self._thread_init = thread_init  # the heartbeat thread's device (engine/device.py)
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def send(self, words: list[int]) -> None:
        """Rank 0, with `lock` held: one step's words (tp_wire.py)."""
        first = torch.zeros(STEP_WORDS, dtype=torch.int64)
        first[0] = len(words)
        head = words[:STEP_WORDS - 1]
        first[1:1 + len(head)] = torch.tensor(head, dtype=torch.int64)
        torch.distributed.broadcast(first, src=0, group=self.group.cpu_pg)
        if len(words) > len(head):
            torch.distributed.broadcast(torch.tensor(words[len(head):], dtype=torch.int64), src=0,
                                        group=self.group.cpu_pg)
        self._last = time.monotonic()

    def receive(self) -> list[int]:
        """A follower: the next step's words (raises when rank 0 is gone or the collective times out)."""
        first = torch.empty(STEP_WORDS, dtype=torch.int64)
        torch.distributed.broadcast(first, src=0, group=self.group.cpu_pg)
        n = int(first[0])
        words = first[1:1 + min(n, STEP_WORDS - 1)].tolist()
        if n > len(words):
            rest = torch.empty(n - len(words), dtype=torch.int64)
            torch.distributed.broadcast(rest, src=0, group=self.group.cpu_pg)
            words += rest.tolist()
        return words

    def start_heartbeat(self) -> None:
        self._heartbeat = threading.Thread(target=self._beat, name="tp-heartbeat", daemon=True)
        self._heartbeat.start()

    def _beat(self) -> None:
        if self._thread_init is not None:
            self._thread_init()
        while not self._stop.wait(LIVENESS_POLL_S):
            dead = self._dead_ranks() if self._dead_ranks is not None else []
            if dead:  # NOTE: without the lock: a forward may sit in a collective that never ends
                self._on_broken(RuntimeError(f"follower rank(s) {dead} exited"))
                return
            if time.monotonic() - self._last < self.heartbeat_s:
                continue
            try:
                with self.lock:
                    if not self._stop.is_set():
                        self.send(StepEncoder.simple(NOOP))
            except BaseException as e:  # noqa: BLE001 - a broken group: the worker goes down
                self._on_broken(e)
                return

    def stop(self, timeout_s: float) -> None:
        """Rank 0: end the followers' loops (one STOP step) and the heartbeat."""
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout_s)
        try:
            with self.lock:
                self.send(StepEncoder.simple(STOP))
        except BaseException as e:  # noqa: BLE001 - followers already gone: nothing to stop
            log.warning("TP group: the stop step failed (%s)", e)


class GroupRunner(ModelRunner):
    """Rank 0's ModelRunner: each forward is broadcast to the followers first, then run here."""

    def __init__(self, model, arch, pool, attention: str, channel: StepChannel):
        super().__init__(model, arch, pool, attention)
        self.channel = channel
        self.encoder = StepEncoder()  # NOTE: used by the scheduler thread only (forwards are not re-entrant)

    def forward(self, chunks: Sequence[Chunk]) -> torch.Tensor:
        check_chunks(chunks, self.pool)  # a bad batch fails its requests here, as at TP 1, not the group
        return self._step(self.encoder.forward(chunks), lambda: super(GroupRunner, self).forward(chunks))

    def forward_every_row(self, chunks, every_row):
        check_chunks(chunks, self.pool)
        return self._step(self.encoder.forward(chunks, every_row),
                          lambda: super(GroupRunner, self).forward_every_row(chunks, every_row))

    def copy_page(self, src: int, dst: int) -> None:
        self._step(StepEncoder.simple(COPY_PAGE, src, dst), lambda: super(GroupRunner, self).copy_page(src, dst))

    def capture_decode_graphs(self, max_batch: int, max_context: int) -> None:
        """Every rank captures the same graphs together: their collectives run (warm-up) and are captured
        in the same order; a replay then runs on every rank at once, each rank replaying its own."""
        self._step(StepEncoder.simple(CAPTURE, max_batch, max_context),
                   lambda: super(GroupRunner, self).capture_decode_graphs(max_batch, max_context))

    def _step(self, words: list[int], run):
        try:
            with self.channel.lock:
                self.channel.send(words)
                return run()
        except BaseException as e:
            self.channel._on_broken(e)
            raise


def follow(channel: StepChannel, runner: ModelRunner) -> None:
    """A follower's loop: do rank 0's steps until STOP (returns) or a broken group (raises)."""
    decoder = StepDecoder()
    while True:
        step = decoder.decode(channel.receive())
        if step.op == FORWARD:
            runner.forward(step.chunks)
        elif step.op == FORWARD_EVERY_ROW:
            runner.forward_every_row(step.chunks, step.every_row)
        elif step.op == COPY_PAGE:
            runner.copy_page(*step.args)
        elif step.op == CAPTURE:
            runner.capture_decode_graphs(*step.args)
        elif step.op == STOP:
            return
        elif step.op != NOOP:
            raise RuntimeError(f"unknown TP step {step.op!r}")
