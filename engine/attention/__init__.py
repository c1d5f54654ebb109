"""Attention backends behind one interface (engine/attention/base.py), picked by name.

    torch   the reference: pages copied out (padded for decode), SDPA with a mask; any device
    paged   K/V read in place through page tables (Triton on CUDA, compiled torch on CPU)
    auto    paged on CUDA; torch on CPU
            NOTE: on CPU the paged decode is compiled (inductor) at the first batch of >= 2 rows: seconds
            of stall inside a worker's scheduler loop for a gain that shows only at large batches
            (docs/workers.md, "Attention backends"), so CPU workers keep the reference unless asked
"""

from __future__ import annotations

BACKENDS = ("auto", "torch", "paged")


def resolve_backend(name: str, device) -> str:
    if name not in BACKENDS:
        raise ValueError(f"attention backend {name!r}: one of {', '.join(BACKENDS)}")
    if name == "auto":
        return "paged" if getattr(device, "type", str(device)).startswith("cuda") else "torch"
    return name


def make_backend(name: str, pool, arch):
    from engine.attention.paged import PagedBackend
    from engine.attention.torch_ref import TorchReference

    cls = {"torch": TorchReference, "paged": PagedBackend}[resolve_backend(name, pool.device)]
    return cls(pool, arch)
