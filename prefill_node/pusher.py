"""KVPusher: writes a finished prompt's pages into the decode worker's pages, off the scheduler thread
(and reads the prefix pages the decode worker's pool holds, when this worker lacks them).

One transfer per request (`GroupTransfer`: with TP on either side, one per pair of ranks sharing heads), of the pages D did not read from the store itself (it merges contiguous runs into one batch call and releases
the GIL), on a small thread pool so a slow or dead decode worker never stalls the scheduler.
A dead peer fails in well under a second (the transfer engine reports it), and the task's pages
are released by the scheduler once the callback reports back.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time

log = logging.getLogger(__name__)


class KVPusher:
    def __init__(self, transfer, page_nbytes: int, max_workers: int = 2, thread_init=None):
        self._transfer = transfer
        self._page_nbytes = page_nbytes
        # thread_init: the worker's device made current in each pusher thread (transfers read its pool)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="kv-push",
                                                           initializer=thread_init)

    def push(self, task, local_addrs: list[int], remote_addrs: list[int], on_done) -> None:
        """Start the transfer of local_addrs[i] -> D's remote_addrs[i]; `on_done(task, err | None,
        nbytes, seconds)` runs on a pusher thread."""
        self._pool.submit(self._push, task, local_addrs, remote_addrs, on_done)

    def _push(self, task, local_addrs: list[int], remote_addrs: list[int], on_done) -> None:
        nbytes = len(local_addrs) * self._page_nbytes
        t0 = time.perf_counter()
        err: Exception | None = None
        try:
            # NOTE: the gate, not a look at the future: an abort between such a look and the write
            # would answer D while the write still goes on (D would reuse the pages under it).
            if not task.push.begin():  # aborted or timed out while waiting for a pusher thread
                raise RuntimeError("request already answered; transfer skipped")
            try:  # the bytes every rank moved (a TP worker's followers' included)
                nbytes = self._transfer.write(task.job.decode_segment, local_addrs, remote_addrs, self._page_nbytes,
                                              task.job.decode_ranks)
            finally:
                task.push.end()  # before on_done: a success answer implies the write is over
        except Exception as e:  # noqa: BLE001 - reported to the scheduler, which fails the task
            log.warning("KV push of %s to %s failed: %s", task.request_id, task.job.decode_segment, e)
            err = e
        try:
            on_done(task, err, nbytes, time.perf_counter() - t0)
        except Exception:
            log.exception("push callback failed for %s", task.request_id)

    def read(self, task, local_addrs: list[int], remote_addrs: list[int], on_done) -> None:
        """Start reading D's remote_addrs[i] -> local_addrs[i] (prefix pages D's pool holds); `on_done(task,
        err | None, nbytes, seconds)` runs on a pusher thread. Through the same gate as the push: once
        the task is answered no read of D's pages starts, and its answer waits for a running one."""
        self._pool.submit(self._read, task, local_addrs, remote_addrs, on_done)

    def _read(self, task, local_addrs: list[int], remote_addrs: list[int], on_done) -> None:
        t0 = time.perf_counter()
        err: Exception | None = None
        try:
            if not task.push.begin():
                raise RuntimeError("request already answered; read skipped")
            try:
                self._transfer.read(task.job.decode_segment, local_addrs, remote_addrs, self._page_nbytes,
                                    task.job.decode_ranks)
            finally:
                task.push.end(last=False)
        except Exception as e:  # noqa: BLE001 - the pages become holes: computed here instead
            log.warning("read of %d prefix pages of %s from %s failed: %s", len(local_addrs), task.request_id,
                        task.job.decode_segment, e)
            err = e
        try:
            on_done(task, err, len(local_addrs) * self._page_nbytes, time.perf_counter() - t0)
        except Exception:
            log.exception("read callback failed for %s", task.request_id)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
