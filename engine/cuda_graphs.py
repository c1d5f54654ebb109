"""CUDA graphs for decode steps: one graph per batch-size bucket, captured once at start-up.

A decode step of a small batch is launch-bound (~45 kernels a layer); replaying a captured graph
launches them all at once. Inputs live in static device buffers that each step refills with ONE
host-to-device copy from a pinned staging buffer (engine/decode_staging.py: ids, positions, write
pages, lengths, and only the page-table cells that changed; the table itself stays on the device,
[max_batch, W] with W pages per sequence at the longest context). A CUDA event recorded after the
copy guards the pinned buffer: the next step writes it only once the copy has read it.

A batch of n < b rows is padded: id 0, position 0, length 1, its K/V written into the pool's
scratch page (KVPool(scratch_page=True)), never into a page a sequence owns. Off on CPU; the
staging and the bucket choice are plain code, unit-tested on CPU.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from engine.attention.batch import ForwardBatch, kv_rows_of
from engine.decode_staging import DecodeStaging
from engine.page_allocator import pages_for

log = logging.getLogger(__name__)


def batch_buckets(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every 16 up to max_batch (always included)."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_batch] + list(range(16, max_batch, 16))
    return sorted(set(sizes + [max_batch]))


def bucket_for(n: int, buckets: Sequence[int]) -> int | None:
    """The smallest bucket holding n rows; None when n is larger than every bucket."""
    return next((b for b in buckets if b >= n), None)


def graph_memory_bytes(max_batch: int, vocab_size: int) -> int:
    """What the captured graphs keep allocated beyond one forward's peak: every bucket's logits
    (fp32, plus the model-dtype matmul output they come from). Pool sizing reserves it."""
    return sum(batch_buckets(max_batch)) * vocab_size * (4 + 2) if max_batch > 0 else 0


class DecodeGraphs:
    """Captured decode steps of one ModelRunner (CUDA)."""

    def __init__(self, runner, max_batch: int, max_context: int):
        pool = runner.pool
        if pool.scratch_page is None:
            raise ValueError("CUDA graphs need a KV pool with a scratch page (KVPool(scratch_page=True))")
        self.runner, self.pool = runner, pool
        self.buckets = batch_buckets(max_batch)
        self.width = pages_for(max_context, pool.page_size)
        dev = runner.device
        self.staging = DecodeStaging(self.buckets[-1], self.width, pool.page_size, pool.scratch_page, pin=True)
        self.device_buf = torch.zeros(self.staging.host.numel(), dtype=torch.int32, device=dev)
        self.table = torch.zeros(self.buckets[-1], self.width, dtype=torch.int32, device=dev)
        self._copied = torch.cuda.Event()  # the last copy out of the pinned buffer
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        # NOTE: the RoPE table must not grow inside a graph (a new tensor the graph would not see): grown
        # first to every position a graph can run. The graphs read the tables of the capture; kept here,
        # so an eager forward that grows the model's table later does not free what they read.
        rope = runner.model.rope
        rope.cos_sin(torch.zeros(1, dtype=torch.long, device=dev), self.width * pool.page_size, runner.model.dtype)
        self._rope_tables = (rope.cos, rope.sin)
        self._mempool = torch.cuda.graph_pool_handle()
        for b in reversed(self.buckets):  # largest first: the smaller ones reuse its memory
            self.graphs[b] = self._capture(b)
        log.info("captured %d decode CUDA graphs (batch buckets %s, %d pages per row)", len(self.graphs),
                 self.buckets, self.width)

    def _views(self, b: int):
        buf = self.device_buf
        ids, pos, pages, lens = (buf[i * b:(i + 1) * b] for i in range(4))
        return ids, pos, pages, lens, self.table[:b]

    def _forward(self, b: int) -> torch.Tensor:
        ids, pos, pages, lens, table = self._views(b)
        pos64 = pos.long()
        batch = ForwardBatch(
            input_ids=ids.long(), positions=pos64, logit_rows=torch.arange(b, device=ids.device),
            kv_rows=kv_rows_of(pages.long(), pos64 % self.pool.page_size, self.pool), prefills=[],
            decode_rows=torch.arange(b, device=ids.device), decode_table=table, decode_lens=lens, max_pos=0,
            only_decode=True)
        backend = self.runner.attention
        backend.begin(batch)
        return self.runner.model(batch.input_ids, batch.positions, batch.logit_rows, backend, 0)

    def _capture(self, b: int):
        self.stage([], b)  # all padding rows: every write goes to the scratch page
        torch.cuda.synchronize()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm up: Triton compiles, cuBLAS picks its kernels
                self._forward(b)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._mempool):
            logits = self._forward(b)
        return graph, logits

    def stage(self, chunks, b: int | None = None) -> int:
        """The inputs of `chunks` on the device for bucket b (default: the smallest that holds them); b."""
        b = b or bucket_for(len(chunks), self.buckets)
        self._copied.synchronize()  # NOTE: the previous step's copy has read the pinned buffer
        n, updates = self.staging.stage(chunks, b)
        self.device_buf[:n].copy_(self.staging.host[:n], non_blocking=True)
        self._copied.record()
        self.staging.apply(self.table, self.device_buf, b, updates)
        return b

    def replay(self, b: int, n: int) -> torch.Tensor:
        """Logits [n, vocab] of the rows staged for bucket b."""
        graph, logits = self.graphs[b]
        graph.replay()
        return logits[:n]

    def can_run(self, chunks) -> bool:
        return (len(chunks) <= self.buckets[-1] and all(len(c.token_ids) == 1 for c in chunks)
                and all(c.start_pos // self.pool.page_size < self.width for c in chunks))

    def run(self, chunks) -> torch.Tensor:
        """Logits [n, vocab] of n decode chunks, by replaying the smallest bucket's graph."""
        return self.replay(self.stage(chunks), len(chunks))
