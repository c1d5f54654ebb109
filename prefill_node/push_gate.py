"""PushGate: fences the decode worker's pages against a task's transfers (pusher vs gRPC threads).

The gate guards D's pages, not ours: once `stop()` ran no transfer of the task can start (the push
into D's pages, or a read of the prefix pages D holds), and it returns True only when none is
running, so nothing touches D's pages any more (docs/workers.md, "Fencing D's pages"). Pusher
threads call `begin`/`end` around each transfer; gRPC handler threads call `stop`.
"""

from __future__ import annotations

import concurrent.futures
import threading


class PushGate:
    def __init__(self, answer: concurrent.futures.Future):
        self._answer = answer  # the task's future: no transfer starts once the caller was answered
        self._cond = threading.Condition()
        self._running = 0  # transfers touching D's pages running now: the push, a read
        self._over = False  # no transfer can start any more

    def begin(self) -> bool:
        """Pusher thread: may a transfer touching D's pages (the push, or a read) start? Not once the
        task was answered or its pushes stopped."""
        with self._cond:
            if self._over or self._answer.done():
                return False
            self._running += 1
            return True

    def end(self, last: bool = True) -> None:
        """Pusher thread: a transfer begun by begin returned (succeeded or failed). `last`: it was the
        push, after which nothing of this task touches D's pages again."""
        with self._cond:
            self._running -= 1
            self._over = self._over or last
            self._cond.notify_all()

    def stop(self, timeout_s: float) -> bool:
        """No transfer starts from now on; True once none is running (waits up to timeout_s for it).

        NOTE: a transfer is one synchronous batch call: when it has returned, every byte of it has
        landed or never will, so "returned" is what D may rely on."""
        with self._cond:
            self._over = True
            return self._cond.wait_for(lambda: self._running == 0, timeout_s)

    @property
    def writes_over(self) -> bool:
        """True when nothing of this task can still touch D's pages (its transfers ended or never will)."""
        with self._cond:
            return self._over and self._running == 0
