"""The device a worker computes on, made current before any kernel, graph or stream is created, in
every thread that does device work.

NOTE: tensors name their device, but Triton launches on the CURRENT CUDA device and CUDA graphs,
streams and NCCL calls use it too; the current device is PER THREAD and a new thread starts on
device 0. A worker on cuda:1 whose scheduler thread never sets it runs its kernels against device
0's context (garbage, a crash, or a context of ~500 MB on GPU 0 per thread). So the main thread
calls `use_device` at start-up and every thread the worker starts for device work (the scheduler
loop, the TP heartbeat, store and transfer I/O, gRPC handlers) runs `device_initializer(device)`
first: threads take it as their first call, thread pools as their `initializer`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch


def use_device(device: str) -> None:
    """Make `device` current in the calling thread when it is a CUDA device ("cuda" means the current one)."""
    if not device.startswith("cuda"):
        return
    index = torch.device(device).index
    if index is not None:
        torch.cuda.set_device(index)


def device_initializer(device: str) -> Callable[[], None]:
    """What a thread doing device work runs first (a pool's `initializer`): `device` made current in it."""
    return functools.partial(use_device, device)
