"""Start-up checks of a worker: misconfigurations that would otherwise fail at the first push, the
first store hit or the first CUDA call. Each problem is one line naming the key or the package.

    model.device cuda    needs a CUDA build of torch and that GPU index to be visible
    model.device cuda    with the non-CUDA Mooncake wheel: the pool's device pointer would go to a
                         transfer engine and a store that can only read host memory
    store.protocol rdma  needs an RDMA device (/sys/class/infiniband), and store.device_name's if set

`probe()` reads the machine; `problems(cfg, facts)` is pure (unit-tested with made-up facts).
"""

from __future__ import annotations

import importlib.metadata
import os
from dataclasses import dataclass

from pdorch.config import Config

MOONCAKE_CPU_WHEEL = "mooncake-transfer-engine-non-cuda"
MOONCAKE_CUDA_WHEEL = "mooncake-transfer-engine"
RDMA_SYSFS = "/sys/class/infiniband"


class StartupError(RuntimeError):
    """The worker cannot start as configured; one line per problem."""


@dataclass(frozen=True)
class MachineFacts:
    torch_version: str
    torch_cuda: str | None            # torch.version.cuda: None for a CPU build
    cuda_devices: int                 # visible GPUs (0 without CUDA)
    mooncake_wheels: tuple[str, ...]  # installed Mooncake distributions
    rdma_devices: tuple[str, ...]     # names under /sys/class/infiniband


def probe() -> MachineFacts:
    import torch

    wheels = []
    for name in (MOONCAKE_CPU_WHEEL, MOONCAKE_CUDA_WHEEL):
        try:
            importlib.metadata.distribution(name)
            wheels.append(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    cuda = torch.version.cuda
    try:
        rdma = tuple(sorted(os.listdir(RDMA_SYSFS)))
    except OSError:
        rdma = ()
    return MachineFacts(torch.__version__, cuda, torch.cuda.device_count() if cuda else 0, tuple(wheels), rdma)


def problems(cfg: Config, facts: MachineFacts) -> list[str]:
    out = []
    device = cfg.model.device
    if device.startswith("cuda"):
        index = int(device.partition(":")[2] or 0)
        if facts.torch_cuda is None:
            out.append(f"model.device {device}: this torch ({facts.torch_version}) is a CPU build; install a CUDA "
                       "build of torch on GPU machines")
        elif index >= facts.cuda_devices:
            out.append(f"model.device {device}: {facts.cuda_devices} GPU(s) visible to this process "
                       f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
        if MOONCAKE_CPU_WHEEL in facts.mooncake_wheels and MOONCAKE_CUDA_WHEEL not in facts.mooncake_wheels:
            out.append(f"model.device {device}: the installed Mooncake wheel {MOONCAKE_CPU_WHEEL} cannot register "
                       f"GPU memory (KV pushes and store reads of a GPU pool would fail); install "
                       f"{MOONCAKE_CUDA_WHEEL} instead")
    if cfg.store.protocol == "rdma":
        wanted = [d.strip() for d in cfg.store.device_name.split(",") if d.strip()]
        if not facts.rdma_devices:
            out.append(f"store.protocol rdma: no RDMA device on this machine ({RDMA_SYSFS} is empty or absent); "
                       "use store.protocol tcp, or give the worker an RDMA device")
        elif any(d not in facts.rdma_devices for d in wanted):
            missing = [d for d in wanted if d not in facts.rdma_devices]
            out.append(f"store.device_name {','.join(missing)}: no such RDMA device (found: "
                       f"{', '.join(facts.rdma_devices)})")
    return out


def check_startup(cfg: Config, facts: MachineFacts | None = None) -> None:
    found = problems(cfg, facts or probe())
    if found:
        raise StartupError("\n".join(found))
