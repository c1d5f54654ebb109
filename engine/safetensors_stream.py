"""Stream safetensors tensors into tensors that already exist on the target device and dtype.

The file is memory-mapped; each tensor is copied in slices of at most CHUNK_BYTES along its first
dim straight into its destination (`dst.copy_` converts dtype and crosses to the device), and the
pages of each slice are dropped from this process (MADV_DONTNEED) once copied. So loading holds no
second copy of the checkpoint in host memory: the overhead is one slice, whatever the model size.

NOTE: safetensors' own `safe_open` keeps the whole mapping resident until the file is closed (every
page read stays in the process's RSS: the checkpoint's size again, measured in bench/engine/model_load.py),
which is why this reads the (simple, documented) format itself:

    [8 bytes: header length N, little-endian u64][N bytes: JSON header][data]
    header = {name: {"dtype": "BF16", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}}
    offsets are relative to the start of data.
"""

from __future__ import annotations

import json
import mmap
import pathlib
from dataclasses import dataclass
from typing import Self

import torch

CHUNK_BYTES = 16 << 20
_MAX_HEADER = 100 << 20
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


class CheckpointError(ValueError):
    """A safetensors file that is not what its header says (truncated, unknown dtype, bad offsets)."""


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int  # absolute byte offset in the file
    end: int

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


class SafetensorsFile:
    """One memory-mapped .safetensors file; use as a context manager."""

    def __init__(self, path: str | pathlib.Path):
        self.path = pathlib.Path(path)
        self._file = open(self.path, "rb")  # noqa: SIM115 - closed in close()
        try:
            self.entries = self._read_header()
            # NOTE: ACCESS_COPY (private, writable) so torch.frombuffer takes it without a warning; nothing writes.
            self._mm = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_COPY) if self.entries else None
        except BaseException:
            self._file.close()
            raise

    def _read_header(self) -> dict[str, TensorEntry]:
        size = self.path.stat().st_size
        raw = self._file.read(8)
        n = int.from_bytes(raw, "little") if len(raw) == 8 else -1
        if not 0 < n <= min(_MAX_HEADER, size - 8):
            raise CheckpointError(f"{self.path}: not a safetensors file (header length {n}, file {size} bytes)")
        try:
            header = json.loads(self._file.read(n))
        except ValueError as e:
            raise CheckpointError(f"{self.path}: unreadable safetensors header: {e}") from None
        entries = {}
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            dtype = _DTYPES.get(meta.get("dtype"))
            if dtype is None:
                raise CheckpointError(f"{self.path}: tensor {name!r} has dtype {meta.get('dtype')!r}, not supported")
            begin, end = (8 + n + int(o) for o in meta["data_offsets"])
            e = TensorEntry(name, dtype, tuple(int(s) for s in meta["shape"]), begin, end)
            if not 8 + n <= begin <= end <= size or end - begin != e.numel * dtype.itemsize:
                raise CheckpointError(f"{self.path}: tensor {name!r} has bad data_offsets (file truncated?)")
            entries[name] = e
        return entries

    def copy_into(self, name: str, dst: torch.Tensor, rows: slice = slice(None), cols: slice = slice(None)) -> None:
        """Copy tensor `name` into `dst` (its shape; any dtype and device), slice by slice.

        `rows` / `cols` (contiguous slices) copy a block instead: a tensor-parallel shard. Only the
        block's rows are read; a column block reads those rows whole and keeps its columns."""
        e = self.entries[name]
        if e.numel:
            src = torch.frombuffer(self._mm, dtype=e.dtype, count=e.numel, offset=e.begin).view(e.shape)
        else:
            src = torch.empty(e.shape, dtype=e.dtype)
        first, block = _block(src, rows, cols)
        if tuple(dst.shape) != tuple(block.shape):
            what = f"{e.shape}" if block is src else f"{e.shape} (its block {tuple(block.shape)})"
            raise CheckpointError(f"{self.path}: tensor {name!r} has shape {what}, expected {tuple(dst.shape)}")
        with torch.no_grad():
            if src.dim() == 0:
                dst.copy_(src)
            elif block.numel():
                n, row_bytes = block.shape[0], (e.end - e.begin) // src.shape[0]
                step = max(1, CHUNK_BYTES // max(row_bytes, 1))
                for r in range(0, n, step):
                    dst[r:r + step].copy_(block[r:r + step])
                    self._drop(e.begin + (first + r) * row_bytes, e.begin + (first + min(n, r + step)) * row_bytes)
        del src, block  # NOTE: the mapping cannot close while a tensor still points into it

    def _drop(self, begin: int, end: int) -> None:
        """Give the pages of [begin, end) back: the copy is done, the page cache keeps them anyway."""
        start = begin - begin % mmap.PAGESIZE
        self._mm.madvise(mmap.MADV_DONTNEED, start, end - start)

    def close(self) -> None:
        if self._mm is not None:
            self._mm.close()
            self._mm = None
        self._file.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _block(src: torch.Tensor, rows: slice, cols: slice) -> tuple[int, torch.Tensor]:
    """(first row, the view src[rows, cols]); a 1-D tensor has rows only, a 0-D one neither."""
    if src.dim() == 0 or (rows == slice(None) and cols == slice(None)):
        return 0, src
    first, stop, step = rows.indices(src.shape[0])
    if step != 1 or (cols != slice(None) and (src.dim() != 2 or cols.step not in (None, 1))):
        raise ValueError(f"copy_into takes contiguous rows (and columns of a 2-D tensor), got [{rows}, {cols}]")
    return first, src[first:stop] if cols == slice(None) else src[first:stop, cols]
