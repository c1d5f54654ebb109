"""SchedulerLoop: the one scheduler thread skeleton both workers run.

    other threads                     scheduler thread (owns the allocator and the model)
    post(msg) --> [inbox] --\\         loop:
    store I/O completion ----+--wake-->  1. messages: Call runs here, the rest go to on_message
                                         2. store I/O completions (store_io.poll()) -> on_completion
                                         3. iterate(now): reap, admit, one forward; True if it worked
                                         4. nothing worked: sleep until woken (work, a completion)
                                            or until the earliest wake_at() deadline, at most IDLE_WAIT_S

One concurrency rule for both workers: only this thread touches the page allocator; every other
thread talks to the scheduler through `post()` (typed messages) or `call()`. There is no polling
interval: StoreIO calls `wake()` when a completion is queued (StoreIO.on_complete).

NOTE: the wake event is cleared only after the wait, before the next drain; a message posted
between the drain and the wait sets the event, so the wait returns at once and nothing is lost.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from pdorch.worker.errors import ShuttingDown, WorkerError

if TYPE_CHECKING:
    from store_client.io_thread import IOCompletion, StoreIO

log = logging.getLogger(__name__)

IDLE_WAIT_S = 0.5  # the longest sleep: deadlines are checked at least this often
CALL_TIMEOUT_S = 30.0

T = TypeVar("T")


@dataclass(frozen=True)
class Call:
    """Run `fn()` on the scheduler thread (between forwards) and hand its result to `future`."""

    fn: Callable[[], object]
    future: concurrent.futures.Future


@dataclass(frozen=True)
class Evicted:
    """Store keys of this worker's pages that left the store: its chain evictor removed them, or
    (`lost`) a master leader switch lost them. Both schedulers take it (prefill_node/persistence.py,
    decode_node/prefix_cache.py)."""

    keys: tuple[str, ...]
    lost: bool = False


class SchedulerLoop:
    def __init__(self, role: str, iterate: Callable[[float], bool], on_message: Callable[[object], None],
                 fail_all: Callable[[WorkerError], None], store_io: StoreIO | None = None,
                 on_completion: Callable[[IOCompletion], None] | None = None,
                 thread_init: Callable[[], None] | None = None):
        """`store_io` (None: no store) comes with `on_completion`, which takes each of its completions."""
        self.role = role
        self._thread_init = thread_init  # the worker's device made current in this thread (engine/device.py)
        self._iterate, self._on_message, self._fail_all = iterate, on_message, fail_all
        self._store_io: tuple[StoreIO, Callable[[IOCompletion], None]] | None = None
        if store_io is not None:
            if on_completion is None:  # its completions (and the leases they return) would be lost
                raise ValueError(f"{role} scheduler loop: store_io given without on_completion")
            self._store_io = (store_io, on_completion)
            store_io.on_complete = self.wake  # completions wake the loop: no polling interval
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._wake_at = float("inf")
        self._thread = threading.Thread(target=self._run, name=f"{role}-scheduler", daemon=True)

    # ---------------------------------------------------------------- called from any thread
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("%s scheduler still running after %.0fs", self.role, timeout_s)

    def post(self, msg: object) -> None:
        self._inbox.put(msg)
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def call(self, fn: Callable[[], T], timeout_s: float = CALL_TIMEOUT_S) -> T:
        """Run fn() on the scheduler thread (between forwards) and return its result."""
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        self.post(Call(fn, fut))
        return fut.result(timeout=timeout_s)

    # ------------------------------------------------------------------------- scheduler thread
    def wake_at(self, t: float) -> None:
        """Sleep no later than monotonic time `t` (a deadline to check); reset every iteration."""
        self._wake_at = min(self._wake_at, t)

    def _run(self) -> None:
        if self._thread_init is not None:
            self._thread_init()
        while not self._stop.is_set():
            self._wake_at = float("inf")
            try:
                self._drain()
                if self._store_io is not None:
                    store_io, on_completion = self._store_io
                    for done in store_io.poll():
                        on_completion(done)
                worked = self._iterate(time.monotonic())
            except Exception:  # a bug must fail requests, not kill the thread silently
                log.exception("%s scheduler iteration failed", self.role)
                self._fail_all(WorkerError(f"{self.role} scheduler error (see worker log)"))
                worked = False
            if not worked:
                self._wake.wait(max(0.0, min(IDLE_WAIT_S, self._wake_at - time.monotonic())))
                self._wake.clear()
        try:  # what was posted before the stop is taken in, so fail_all answers it too
            self._drain()
        except Exception:  # shutting down anyway: log it and still fail what is left
            log.exception("%s scheduler: draining the inbox at stop failed", self.role)
        self._fail_all(ShuttingDown(f"{self.role} worker is shutting down"))

    def _drain(self) -> None:
        while True:
            try:
                msg = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(msg, Call):
                self._run_call(msg)
            else:
                self._on_message(msg)

    @staticmethod
    def _run_call(msg: Call) -> None:
        try:
            msg.future.set_result(msg.fn())
        except Exception as e:  # noqa: BLE001 - handed back to the caller
            msg.future.set_exception(e)
