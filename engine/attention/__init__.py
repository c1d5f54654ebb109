"""Attention backends behind one interface (engine/attention/base.py), picked by name.

    torch   the reference: pages copied out (padded for decode), SDPA with a mask; any device
    paged   K/V read in place through page tables by Triton kernels on CUDA; on CPU it differs from
            the reference only in prefilling from the chunk's own K/V
    auto    paged on CUDA; torch on CPU
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
