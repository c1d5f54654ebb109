"""The decode scheduler: one thread running the continuous decode batch.

Each step: take new requests (their prompt KV already sits in their pages, written by P), drop
aborted / expired ones, fill the batch up to `max_running_requests` (FIFO), give every request a
page for the position it feeds, run ONE forward of 1-token chunks, sample, run the stop checks,
stream the new tokens, offload the pages that just filled (ALL of this step's pages in ONE store
write, each page owned by its request so an abort takes only its own pages out), and free finished
requests' pages once no offload still reads them. Requests join and leave at every step.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time

import torch
from prometheus_client import Counter

from decode_node.offload import extend_hash_chain, filled_page
from decode_node.request import DecodeEvent, DecodeRequest
from decode_node.stopping import check_stop
from engine.model_runner import Chunk
from engine.page_allocator import OutOfPages
from pdorch.worker.errors import Aborted, DeadlineExceeded, Overloaded, ShuttingDown, WorkerError
from store_client.page_hash import store_key

log = logging.getLogger(__name__)

IO_POLL_S = 0.005
IDLE_WAIT_S = 0.5


class DecodeScheduler:
    def __init__(self, rt, admission, max_running: int, offload: bool, recorder):
        self._rt = rt
        self._admission = admission
        self._max_running = max_running
        self._offload = offload and rt.store_io is not None
        self._rec = recorder
        self._page_size = rt.cfg.model.page_size
        self._max_context = rt.cfg.model.max_context_tokens or rt.arch.max_position_embeddings
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._waiting: collections.deque[DecodeRequest] = collections.deque()
        self._running: list[DecodeRequest] = []
        self._draining: list[DecodeRequest] = []  # answered, pages still read by offload saves
        self._filled: list[tuple[DecodeRequest, str, int, int]] = []  # this step's (request, key, page id, depth)
        self._offload_steps = Counter("pdorch_decode_offload_steps", "Decode steps that filled pages to offload "
                                      "(each submits ONE store write for all of them)", registry=recorder.registry)
        self._offload_pages = Counter("pdorch_decode_offload_pages", "Generated pages submitted for offload",
                                      registry=recorder.registry)
        self._io_inflight = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="decode-scheduler", daemon=True)
        self.num_waiting = 0
        self.num_running = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)

    def join(self, req: DecodeRequest) -> None:
        """Hand a prefilled request to the batch (from a handler thread)."""
        self._inbox.put(req)
        self._wake.set()

    def wake(self) -> None:
        """Make the loop look at cancellations now (Abort sets req.cancelled, then calls this)."""
        self._wake.set()

    # ------------------------------------------------------------------------- scheduler thread
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._drain_inbox()
                self._poll_io()
                self._reap(time.monotonic())
                while self._waiting and len(self._running) < self._max_running:
                    self._running.append(self._waiting.popleft())
                worked = self._step() if self._running else False
            except Exception:  # a bug must fail requests, not kill the thread silently
                log.exception("decode scheduler step failed")
                for req in self._running + list(self._waiting):
                    self._finish(req, DecodeEvent(error=WorkerError("decode scheduler error (see worker log)")))
                worked = False
            self.num_waiting, self.num_running = len(self._waiting), len(self._running)
            if not worked:
                self._wake.wait(IO_POLL_S if self._io_inflight else IDLE_WAIT_S)
                self._wake.clear()
        for req in self._running + list(self._waiting):
            req.emit(DecodeEvent(error=ShuttingDown("decode worker is shutting down")))

    def _drain_inbox(self) -> None:
        while True:
            try:
                self._waiting.append(self._inbox.get_nowait())
            except queue.Empty:
                return

    def _poll_io(self) -> None:
        if self._rt.store_io is None:
            return
        index = getattr(self._rt, "chain_index", None)
        for done in self._rt.store_io.poll():
            self._io_inflight -= 1
            owners, keys, depths = done.tag
            for req in owners:  # the distinct requests of one step's offload
                req.io_pending -= 1
            self._rec.count_store_written(done.pages_ok, kind="offload")
            if index is not None:  # in the store now: the evictor ranks them by depth in their chain
                for key, depth, ok in zip(keys, depths, done.page_ok):
                    if ok:
                        index.touch([key], first_depth=depth)
        still = []
        for req in self._draining:
            if req.io_pending > 0:
                still.append(req)
            else:
                self._release(req)
        self._draining = still

    def _reap(self, now: float) -> None:
        for req in self._running + list(self._waiting):
            if req.cancelled:
                self._finish(req, DecodeEvent(error=Aborted(f"request {req.request_id} aborted")), aborted=True)
            elif now > req.deadline:
                self._finish(req, DecodeEvent(error=DeadlineExceeded(
                    f"request {req.request_id} missed its deadline ({req.job.timeout_s:.1f}s) after "
                    f"{req.num_generated} generated tokens")))

    def _finish(self, req: DecodeRequest, event: DecodeEvent, aborted: bool = False) -> None:
        """Send the final event and take the request out of the batch; pages go back once no save reads them."""
        req.emit(event)
        if event.error is None:
            self._rec.request_finished()
        else:
            self._rec.request_failed(aborted=aborted)
        if aborted and req.io_pending > 0:
            self._rt.store_io.cancel_owner(req)  # its queued offload pages are not written
        if req in self._running:
            self._running.remove(req)
        elif req in self._waiting:
            self._waiting.remove(req)
        if req.io_pending > 0:
            self._draining.append(req)
        else:
            self._release(req)

    def _release(self, req: DecodeRequest) -> None:
        if req.page_ids:
            self._admission.release(req.page_ids)
            req.page_ids = []

    def _step(self) -> bool:
        page_size = self._page_size
        batch, chunks = [], []
        for req in list(self._running):
            pos = len(req.token_ids) - 1  # the newest token is fed now; its K/V lands at `pos`
            if pos // page_size >= len(req.page_ids):
                try:
                    req.page_ids.extend(self._admission.allocate(1))
                except OutOfPages:
                    self._finish(req, DecodeEvent(error=Overloaded(
                        f"KV pool exhausted while decoding {req.request_id} (raise decode.num_pages or lower "
                        f"decode.kv_watermark)")))
                    continue
            batch.append(req)
            chunks.append(Chunk(page_ids=req.page_ids[:pos // page_size + 1], start_pos=pos,
                                token_ids=[req.token_ids[-1]]))
        if not batch:
            return False
        with torch.inference_mode():
            logits = self._rt.runner.forward(chunks)
        tokens = self._rt.sampler.sample(logits, [r.job.params for r in batch], [r.generator for r in batch])
        self._rec.generated(len(batch))
        for req, token in zip(batch, tokens):
            self._after_feed(req, len(req.token_ids) - 1)
            req.token_ids.append(int(token))
            event = check_stop(req, int(token), self._max_context)
            if event.final:
                self._finish(req, event)
            elif event.token_ids or event.text:
                req.emit(event)
        self._offload_filled()
        return True

    def _offload_filled(self) -> None:
        """One store write for every page that filled in this step (bounded queue, deadline: StoreIO)."""
        filled, self._filled = self._filled, []
        if not filled:
            return
        owners = tuple(dict.fromkeys(req for req, _, _, _ in filled))  # io_pending taken in _after_feed
        self._offload_steps.inc()
        self._offload_pages.inc(len(filled))
        keys = [key for _, key, _, _ in filled]
        self._rt.store_io.submit_save((owners, keys, [depth for _, _, _, depth in filled]), keys,
                                      self._rt.pool.page_addrs([page for _, _, page, _ in filled]),
                                      owners=[req for req, _, _, _ in filled])
        self._io_inflight += 1

    def _after_feed(self, req: DecodeRequest, pos: int) -> None:
        """Extend the hash chain when feeding `pos` filled a page, and offload that page."""
        k = filled_page(pos, self._page_size)
        if k is None:
            return
        h = extend_hash_chain(req.page_hashes, req.token_ids, k, self._page_size)
        if self._offload and self._rt.store.enabled:
            key = store_key(self._rt.fingerprint, h)
            if not any(r is req for r, _, _, _ in self._filled):
                # NOTE: taken now, not at submission: a request finishing in this very step must
                # keep its pages until the step's write has read them.
                req.io_pending += 1
            self._filled.append((req, key, req.page_ids[k], k))
