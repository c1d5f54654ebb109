"""The device a process computes on, made current before any kernel, graph or stream is created.

NOTE: tensors name their device, but Triton launches on the CURRENT CUDA device and CUDA graphs and
streams are created on it too: a worker on cuda:1 that never sets it runs its kernels against
device 0's context (garbage or a crash on any machine with several GPUs).
"""

from __future__ import annotations

import torch


def use_device(device: str) -> None:
    """Make `device` current in this process when it is a CUDA device ("cuda" means the current one)."""
    if not device.startswith("cuda"):
        return
    index = torch.device(device).index
    if index is not None:
        torch.cuda.set_device(index)
