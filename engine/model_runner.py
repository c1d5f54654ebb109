"""ModelRunner: one forward pass over a mixed batch of chunks, with K/V kept in the paged pool.

A Chunk is `len(token_ids)` new tokens of one sequence at positions start_pos..end-1. Its
`page_ids` cover positions 0..end-1 (page i holds positions i*S .. i*S+S-1, S = page_size):

    positions   0 ........ S-1 | S ....... 2S-1 | 2S .. end-1
    page_ids    [   p0         |    p1          |    p2       ]
                 cached earlier (start_pos = S+3)^  new tokens ^end

Per layer: the new K/V are written into (page, slot) = (page_ids[pos // S], pos % S), then each
query attends to every key at positions <= its own, read from the pool by the attention backend
(engine/attention/), so prefill on top of cached pages, chunked prefill and decode share one code
path. The batch layout goes to the device in one copy (engine/attention/batch.py); a batch of
decode rows only may replay a captured CUDA graph instead (engine/cuda_graphs.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.arch import ModelArch
from engine.attention import make_backend
from engine.attention.batch import Chunk, build_batch
from engine.kv_pool import KVPool
from engine.model import DecoderModel

__all__ = ["Chunk", "ModelRunner"]


class ModelRunner:
    def __init__(self, model: DecoderModel, arch: ModelArch, pool: KVPool, attention: str = "auto"):
        self.model, self.arch, self.pool = model, arch, pool
        self.device = model.device
        self.attention = make_backend(attention, pool, arch)
        self.graphs = None  # engine.cuda_graphs.DecodeGraphs, when enabled (CUDA only)

    def capture_decode_graphs(self, max_batch: int, max_context: int) -> None:
        """CUDA only: capture decode steps of up to max_batch rows (engine/cuda_graphs.py)."""
        from engine.cuda_graphs import DecodeGraphs

        if self.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, the model is on {self.device}")
        self.graphs = DecodeGraphs(self, max_batch, max_context)

    def forward(self, chunks: Sequence[Chunk]) -> torch.Tensor:
        """Logits [len(chunks), vocab] (fp32) at each chunk's last token.

        NOTE: not re-entrant (the batch layout lives in the backend during the call): one forward at
        a time, from the worker's scheduler thread.
        """
        if self.graphs is not None and self.graphs.can_run(chunks):
            return self.graphs.run(chunks)
        batch = build_batch(chunks, self.pool, self.device)
        self.attention.begin(batch)
        return self.model(batch.input_ids, batch.positions, batch.logit_rows, self.attention, batch.max_pos)

    def copy_page(self, src: int, dst: int) -> None:
        """Copy pool page src into dst (a TP worker's GroupRunner does it on every rank)."""
        self.pool.tensor[dst].copy_(self.pool.tensor[src])

    def forward_every_row(self, chunks: Sequence[Chunk], every_row: Sequence[bool]
                          ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """As forward(), plus the logits at every token of the chunks marked in `every_row` (prompt
        logprobs): (logits [len(chunks), vocab] at each chunk's last token, {chunk index: logits
        [its tokens, vocab]}). A prefill path: no CUDA graph."""
        batch = build_batch(chunks, self.pool, self.device)
        rows, last, spans, start = [], [], {}, 0
        for i, c in enumerate(chunks):
            n = len(c.token_ids)
            if every_row[i]:
                spans[i] = slice(len(rows), len(rows) + n)
                rows.extend(range(start, start + n))
            else:
                rows.append(start + n - 1)
            last.append(len(rows) - 1)
            start += n
        self.attention.begin(batch)
        logits = self.model(batch.input_ids, batch.positions, torch.tensor(rows, device=self.device),
                            self.attention, batch.max_pos)
        return logits[last], {i: logits[s] for i, s in spans.items()}
