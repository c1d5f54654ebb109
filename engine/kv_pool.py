"""KVPool: the one pre-allocated KV tensor of a worker, page-first then head-major (docs/design.md section 3).

    tensor[page, kv_head, layer, 0=K|1=V, slot, head_dim]

One page = one contiguous block of `page_nbytes` bytes = one transfer unit, so page `i` lives at
`base_ptr + i * page_nbytes` for the store and the transfer engine. Inside a page each KV head is one
contiguous block of `head_nbytes` (all layers, K and V): any range of heads is one contiguous span
of a page, which is what lets the store keep a page as one object per head group and a worker of
another TP size read or receive exactly its heads in place (engine/tensor_parallel.py).

Attention reads the same memory as `rows` [pages * Hkv * L * 2 * P, head_dim] (engine/attention/
batch.py gives the row arithmetic). `scratch_page` adds one page after the last (id `num_pages`,
never handed out, never registered): CUDA-graph padding rows write their K/V there.
"""

from __future__ import annotations

import torch

from engine.arch import ModelArch


class KVPool:
    def __init__(self, arch: ModelArch, num_pages: int, page_size: int, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu", scratch_page: bool = False):
        if num_pages < 1 or page_size < 1:
            raise ValueError(f"KVPool needs num_pages >= 1 and page_size >= 1, got {num_pages}, {page_size}")
        self.arch = arch
        self.num_pages = num_pages
        self.page_size = page_size
        self.dtype = dtype
        self.device = torch.device(device)
        total = num_pages + (1 if scratch_page else 0)
        self.scratch_page = num_pages if scratch_page else None
        self._storage = torch.zeros((total, arch.num_kv_heads, arch.num_layers, 2, page_size, arch.head_dim),
                                    dtype=dtype, device=self.device)
        self.tensor = self._storage[:num_pages]
        self.rows = self._storage.view(-1, arch.head_dim)
        self.layer_row_stride = 2 * page_size                       # rows from one layer to the next
        self.head_row_stride = arch.num_layers * 2 * page_size      # rows from one KV head to the next
        self.page_nbytes = self.tensor[0].numel() * self.tensor.element_size()
        self.head_nbytes = self.page_nbytes // arch.num_kv_heads
        self.nbytes = self.page_nbytes * num_pages
        self.base_ptr = self.tensor.data_ptr()

    def page_addr(self, page_id: int) -> int:
        if not 0 <= page_id < self.num_pages:
            raise IndexError(f"page id {page_id} outside the pool (0..{self.num_pages - 1})")
        return self.base_ptr + page_id * self.page_nbytes

    def page_addrs(self, page_ids) -> list[int]:
        return [self.page_addr(int(p)) for p in page_ids]

    def heads_span(self, heads: range) -> tuple[int, int]:
        """(offset, nbytes) inside a page of the pool's KV heads `heads` (one contiguous span)."""
        if not heads or heads.step != 1 or heads.start < 0 or heads.stop > self.arch.num_kv_heads:
            raise IndexError(f"KV heads {heads} outside the pool's 0..{self.arch.num_kv_heads - 1}")
        return heads.start * self.head_nbytes, len(heads) * self.head_nbytes

    def layer_view(self, layer: int) -> torch.Tensor:
        """[num_pages, 2, kv_heads, page_size, head_dim] view of one layer (no copy; strided)."""
        return self.tensor[:, :, layer].transpose(1, 2)
