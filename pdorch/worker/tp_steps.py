"""The steps of a tensor-parallel worker: rank 0 broadcasts each pool-changing step, the follower
ranks do the same step on their shard (as SGLang's TP workers follow their scheduler's broadcast).

    rank 0 (scheduler thread)                   follower r (main thread, follow())
    GroupRunner.forward(chunks)
      lock; broadcast ("forward", chunks) --->  receive -> runner.forward(chunks)
      runner.forward(chunks)  <-- all-reduce / all-gather inside the model -->
      unlock
    copy_page(src, dst)       ------------->    pool.tensor[dst] = pool.tensor[src]
    (idle tp_timeout_s / 4)   ("noop") ----->   (nothing: the collective's deadline starts again)
    close()                   ("stop") ----->   return

One lock orders every collective of rank 0: the heartbeat thread never slips a broadcast between a
step's broadcast and the collectives of its forward. Every collective has the group's timeout, so a
rank that hangs or dies fails the others' next collective instead of stalling them: a follower
then exits, and rank 0 takes the worker down (`on_broken`), which pdorch serve / Kubernetes restart.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

import torch

from engine.attention.batch import Chunk, check_chunks
from engine.model_runner import ModelRunner

log = logging.getLogger(__name__)

class StepChannel:
    """Ordered steps from rank 0 to the followers over the TP group (torch.distributed broadcast)."""

    def __init__(self, group, on_broken: Callable[[BaseException], None], heartbeat_s: float = 15.0):
        self.group, self.heartbeat_s = group, heartbeat_s  # rank 0 idle this long: one "noop" step
        self.lock = threading.Lock()  # held for a step's broadcast AND its collectives
        self._on_broken = on_broken
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def send(self, op: tuple) -> None:
        """Rank 0, with `lock` held."""
        torch.distributed.broadcast_object_list([op], src=0, group=self.group.pg)
        self._last = time.monotonic()

    def receive(self) -> tuple:
        """A follower: the next step (raises when rank 0 is gone or the collective times out)."""
        box = [None]
        torch.distributed.broadcast_object_list(box, src=0, group=self.group.pg)
        return box[0]

    def start_heartbeat(self) -> None:
        self._heartbeat = threading.Thread(target=self._beat, name="tp-heartbeat", daemon=True)
        self._heartbeat.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s / 5):
            if time.monotonic() - self._last < self.heartbeat_s:
                continue
            try:
                with self.lock:
                    if not self._stop.is_set():
                        self.send(("noop",))
            except BaseException as e:  # noqa: BLE001 - a broken group: the worker goes down
                self._on_broken(e)
                return

    def stop(self, timeout_s: float) -> None:
        """Rank 0: end the followers' loops (one "stop" step) and the heartbeat."""
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout_s)
        try:
            with self.lock:
                self.send(("stop",))
        except BaseException as e:  # noqa: BLE001 - followers already gone: nothing to stop
            log.warning("TP group: the stop step failed (%s)", e)


class GroupRunner(ModelRunner):
    """Rank 0's ModelRunner: each forward is broadcast to the followers first, then run here."""

    def __init__(self, model, arch, pool, attention: str, channel: StepChannel):
        super().__init__(model, arch, pool, attention)
        self.channel = channel

    def forward(self, chunks: Sequence[Chunk]) -> torch.Tensor:
        check_chunks(chunks, self.pool)  # a bad batch fails its requests here, as at TP 1, not the group
        return self._step(("forward", list(chunks)), lambda: super(GroupRunner, self).forward(chunks))

    def forward_every_row(self, chunks, every_row):
        check_chunks(chunks, self.pool)
        return self._step(("forward_every_row", list(chunks), list(every_row)),
                          lambda: super(GroupRunner, self).forward_every_row(chunks, every_row))

    def copy_page(self, src: int, dst: int) -> None:
        self._step(("copy_page", src, dst), lambda: super(GroupRunner, self).copy_page(src, dst))

    def _step(self, op: tuple, run):
        try:
            with self.channel.lock:
                self.channel.send(op)
                return run()
        except BaseException as e:
            self.channel._on_broken(e)
            raise


def follow(channel: StepChannel, runner: ModelRunner) -> None:
    """A follower's loop: do rank 0's steps until "stop" (returns) or a broken group (raises)."""
    while True:
        op = channel.receive()
        kind = op[0]
        if kind == "forward":
            runner.forward(op[1])
        elif kind == "forward_every_row":
            runner.forward_every_row(op[1], op[2])
        elif kind == "copy_page":
            runner.copy_page(op[1], op[2])
        elif kind == "stop":
            return
        elif kind != "noop":
            raise RuntimeError(f"unknown TP step {kind!r}")
