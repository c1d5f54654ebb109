"""StreamSlots: the worker's SETTINGS_MAX_CONCURRENT_STREAMS, kept on the router's side.

A call waits (FIFO, within its deadline) for a free stream instead of being refused by the worker.
A slot handed to a waiter counts as taken until the waiter starts its call (`handed`), so two
waiters woken together cannot both take the last stream.

    free slots = limit - open streams - handed
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

import grpc

from router.grpc.call import RpcError


class StreamSlots:
    def __init__(self, loop: asyncio.AbstractEventLoop, address: str, open_streams: Callable[[], int]):
        self.loop = loop
        self.address = address
        self.limit = 1 << 31  # until the worker's SETTINGS say otherwise
        self._open_streams = open_streams
        self._waiters: deque[asyncio.Future] = deque()  # calls waiting for a free stream
        self._handed = 0  # free streams handed to waiters that have not started their call yet

    def _has_room(self) -> bool:
        return self._open_streams() + self._handed < self.limit

    def free(self) -> bool:
        """The worker allows one more stream now and no call waits for one (the hot path)."""
        return not self._waiters and self._has_room()

    async def acquire(self, deadline: float) -> bool:
        """Wait until the worker allows one more stream; False if the connection became unusable
        meanwhile. The caller must start its call at once (no await in between)."""
        if self.free():
            return True
        fut = self.loop.create_future()
        self._waiters.append(fut)
        timer = self.loop.call_at(deadline, lambda: None if fut.done() else fut.set_result(None))
        try:
            got = await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.result():
                self._handed -= 1  # handed a stream but gone: pass it on
                self.hand_on()
            elif fut in self._waiters:
                self._waiters.remove(fut)
            raise
        finally:
            timer.cancel()
        if got is None:
            self._waiters.remove(fut)
            raise RpcError(grpc.StatusCode.DEADLINE_EXCEEDED, f"no stream free on the connection to {self.address} "
                           f"within the deadline (the worker allows {self.limit} concurrent calls)")
        if got:
            self._handed -= 1
        return got

    def hand_on(self) -> None:
        """A stream ended or the limit rose: wake as many waiters as there is room for."""
        while self._waiters and self._has_room():
            fut = self._waiters.popleft()
            if not fut.done():
                self._handed += 1
                fut.set_result(True)

    def release_all(self) -> None:
        """The connection is unusable: every waiter gets False (it connects again elsewhere)."""
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(False)
