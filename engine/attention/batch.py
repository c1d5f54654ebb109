"""ForwardBatch: the layout of one forward over a mixed batch of chunks, built once per forward on
the host and sent to the device in ONE copy (pinned on CUDA), then read by every layer.

A chunk is `n` new tokens of one sequence at positions start..end-1, its page table covering
0..end-1. Token rows of the flattened batch are the chunks in order:

    rows      [ chunk 0 (n0 rows) | chunk 1 | ... ]
    decode    chunks of 1 token   -> one batched paged-attention call over their page tables
    prefill   longer chunks       -> one call each (start 0: plain causal; start > 0: on a cached prefix)

Where a token's K/V goes, as a row of the pool seen as [num_rows, head_dim] (KVPool.rows):

    row(page, layer, kv, head, slot) = (((page * Hkv + head) * L + layer) * 2 + kv) * S + slot   (S = page_size)

`kv_rows` holds layer 0's rows [T, 2, Hkv]; layer l adds l * 2 * S (KVPool.layer_row_stride).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.page_allocator import pages_for


@dataclass(frozen=True)
class Chunk:
    page_ids: Sequence[int]
    start_pos: int
    token_ids: Sequence[int]

    @property
    def end(self) -> int:
        return self.start_pos + len(self.token_ids)


@dataclass
class PrefillChunk:
    rows: slice                 # rows of the flattened batch
    start: int                  # first new position (> 0: attends to a cached prefix too)
    end: int                    # one past the last position
    table: torch.Tensor         # [ceil(end / S)] page ids (device, int64)


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor     # [T]
    positions: torch.Tensor     # [T]
    logit_rows: torch.Tensor    # [chunks] the last row of each chunk
    kv_rows: torch.Tensor       # [T, 2, Hkv] layer-0 pool rows of each token's K and V
    prefills: list[PrefillChunk]
    decode_rows: torch.Tensor | None   # [Bd] rows of the decode chunks; None: no decode chunk
    decode_table: torch.Tensor | None  # [Bd, max pages] (int32), padded with page 0 (masked by length)
    decode_lens: torch.Tensor | None   # [Bd] (int32) tokens each decode row attends to
    max_pos: int
    only_decode: bool           # every chunk is 1 token: decode rows are 0..T-1 in order


def stage(arrays: dict[str, list[int]], device: torch.device, dtype=torch.int64) -> dict[str, torch.Tensor]:
    """Host int lists -> device tensors through one buffer and one host-to-device copy.

    NOTE: on CUDA the buffer is pinned and the copy asynchronous: the host does not wait for it, and
    the kernels that read the views are queued after it on the same stream.
    """
    flat: list[int] = []
    spans = {}
    for name, values in arrays.items():
        spans[name] = (len(flat), len(values))
        flat.extend(values)
    host = torch.tensor(flat, dtype=dtype)
    if device.type == "cuda":
        buf = host.pin_memory().to(device, non_blocking=True)
    else:
        buf = host.to(device)
    return {name: buf[a:a + n] for name, (a, n) in spans.items()}


def kv_rows_of(pages: torch.Tensor, slots: torch.Tensor, pool) -> torch.Tensor:
    """Layer-0 pool rows [T, 2, Hkv] of tokens at (page, slot)."""
    L, H, S = pool.arch.num_layers, pool.arch.num_kv_heads, pool.page_size
    base = pages * (H * L * 2 * S) + slots                                  # [T]
    offs = (torch.arange(2, device=pages.device)[:, None] * S
            + torch.arange(H, device=pages.device) * pool.head_row_stride)
    return base[:, None, None] + offs                                       # [T, 2, H]


def check_chunks(chunks: Sequence[Chunk], pool) -> None:
    """ValueError for a batch the pool cannot hold (what build_batch refuses), before any work."""
    if not chunks:
        raise ValueError("forward() needs at least one chunk")
    for c in chunks:
        n = len(c.token_ids)
        if n == 0 or c.start_pos < 0:
            raise ValueError(f"bad chunk: {n} tokens at start_pos {c.start_pos}")
        need = pages_for(c.end, pool.page_size)
        if len(c.page_ids) < need:
            raise ValueError(f"chunk ending at position {c.end} needs {need} pages, got {len(c.page_ids)}")
        table = c.page_ids[:need]
        if min(table) < 0 or max(table) >= pool.num_pages:
            raise ValueError(f"page ids {list(table)} outside the pool (0..{pool.num_pages - 1})")


def build_batch(chunks: Sequence[Chunk], pool, device: torch.device) -> ForwardBatch:
    """The batch layout of `chunks`; raises ValueError for a chunk the pool cannot hold."""
    check_chunks(chunks, pool)
    S = pool.page_size
    ids: list[int] = []
    pos: list[int] = []
    pages: list[int] = []
    ends: list[int] = []
    decode_rows: list[int] = []
    decode_tables: list[Sequence[int]] = []
    decode_lens: list[int] = []
    prefill_specs = []
    for c in chunks:
        n = len(c.token_ids)
        table = list(c.page_ids[:pages_for(c.end, S)])
        row = len(ids)
        ids.extend(c.token_ids)
        pos.extend(range(c.start_pos, c.end))
        pages.extend(table[p // S] for p in range(c.start_pos, c.end))
        if n == 1:
            decode_rows.append(row)
            decode_tables.append(table)
            decode_lens.append(c.end)
        else:
            prefill_specs.append((slice(row, row + n), c.start_pos, c.end, table))
        ends.append(len(ids) - 1)
    arrays = {"ids": ids, "pos": pos, "pages": pages, "ends": ends}
    width = max((len(t) for t in decode_tables), default=0)
    if decode_rows:
        arrays["decode_rows"] = decode_rows
        arrays["decode_table"] = [p for t in decode_tables for p in (*t, *[0] * (width - len(t)))]
        arrays["decode_lens"] = decode_lens
    for i, (_, _, _, table) in enumerate(prefill_specs):
        arrays[f"prefill{i}"] = table
    dev = stage(arrays, device)
    positions = dev["pos"]
    prefills = [PrefillChunk(rows, start, end, dev[f"prefill{i}"])
                for i, (rows, start, end, _) in enumerate(prefill_specs)]
    return ForwardBatch(
        input_ids=dev["ids"], positions=positions, logit_rows=dev["ends"],
        kv_rows=kv_rows_of(dev["pages"], positions % S, pool), prefills=prefills,
        decode_rows=dev.get("decode_rows"),
        decode_table=dev["decode_table"].view(len(decode_rows), width).int() if decode_rows else None,
        decode_lens=dev["decode_lens"].int() if decode_rows else None,
        max_pos=max(c.end for c in chunks), only_decode=not prefill_specs)
