"""A tensor-parallel worker's ranks as processes: rank 0 (the worker process itself: scheduler, gRPC,
registration) starts its followers (`python -m pdorch.worker.tp_follower`), owns them and stops them.

    rank 0                                       follower r (1 .. tp_size - 1)
    FollowerProcesses.start()  -- spawn -->      main(): config, torch threads, device cuda:(i + r)
    join(): init_tp_group(0)   <-- rendezvous -> init_tp_group(r)       (file:// in a private dir)
    load its shard, size its pool                the same, in lockstep (min of the pages any rank fits)
    exchange(): all_gather                       its PoolRank (segment, pool, heads) and gRPC address
    serve; steps over StepChannel  ----------->  follow() (tp_steps.py); I/O on its gRPC (tp_io.py)
    close(): "stop" step, wait, kill             exits

A follower exits when rank 0 goes away (its next collective fails, or its parent is gone); rank 0
exits when a follower does (tp_steps.py, `on_broken`). Either way the whole worker goes down and is
restarted as a group (pdorch serve, or the pod's restart policy).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from engine.tensor_parallel import TPGroup, init_tp_group
from pdorch.config import Config
from pdorch.config_loader import dump_config
from pdorch.worker.tp_transfer import PoolRank

if TYPE_CHECKING:  # tp_io and tp_steps load when a group connects (they import grpc and the engine runner)
    from engine.kv_pool import KVPool
    from engine.model import DecoderModel
    from pdorch.worker.tp_io import Followers
    from pdorch.worker.tp_steps import GroupRunner

log = logging.getLogger(__name__)

STOP_WAIT_S = 10.0   # followers get this long to exit after the "stop" step before they are killed


def backend_for(device: str) -> str:
    return "nccl" if device.startswith("cuda") else "gloo"


def rank_device(device: str, rank: int) -> str:
    """Rank r's device: cuda:(i + r) for a worker on cuda:i (one GPU per rank); cpu stays cpu."""
    if not device.startswith("cuda"):
        return device
    return f"cuda:{int(device.partition(':')[2] or 0) + rank}"


class FollowerProcesses:
    """Rank 0's follower processes and the group's rendezvous directory."""

    def __init__(self, cfg: Config, size: int, num_pages: int, use_store: bool, component: str):
        self.size = size
        self.dir = tempfile.mkdtemp(prefix="pdorch-tp-")
        self.init_method = f"file://{os.path.join(self.dir, 'rendezvous')}"
        config_path = os.path.join(self.dir, "config.yaml")
        dump_config(without_secrets(cfg), config_path)  # NOTE: a followers' own dir (0700), secrets left out
        self.procs: list[subprocess.Popen] = []
        try:
            for rank in range(1, size):
                argv = [sys.executable, "-m", "pdorch.worker.tp_follower", "--config", config_path,
                        "--rank", str(rank), "--size", str(size), "--init", self.init_method,
                        "--num-pages", str(num_pages), "--component", f"{component}-rank{rank}"]
                if not use_store:
                    argv.append("--no-store")
                self.procs.append(subprocess.Popen(argv))
        except BaseException:
            self.kill()
            raise
        log.info("TP: started %d follower ranks (pids %s)", size - 1, [p.pid for p in self.procs])

    def join(self, device: str, timeout_s: float) -> TPGroup:
        """Rank 0 joins the group: blocks until every follower has (engine/tensor_parallel.py JOIN_TIMEOUT_S, or
        at once when one has exited); then a collective fails after timeout_s (model.tp_timeout_s)."""
        try:
            return init_tp_group(0, self.size, self.init_method, backend_for(device), timeout_s,
                                 check=self._all_alive)
        except BaseException:
            self.kill()
            raise

    def _all_alive(self) -> None:
        """While the group forms: a follower that has exited (bad config, out of memory) fails the join at once."""
        if dead := self.dead():
            raise RuntimeError(f"tensor-parallel follower ranks {dead} exited before the group formed")

    def dead(self) -> list[int]:
        """Ranks whose process has exited."""
        return [r for r, p in enumerate(self.procs, 1) if p.poll() is not None]

    def wait(self, timeout_s: float) -> None:
        """Wait for every follower to exit; kill those still running after timeout_s."""
        deadline = time.monotonic() + timeout_s
        for p in self.procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("TP follower pid %d did not exit within %.0f s: killing it", p.pid, timeout_s)
        self.kill()

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)


def without_secrets(cfg: Config) -> Config:
    """The config with every secret key empty: followers serve no API and no worker gRPC port."""
    import dataclasses

    from pdorch.launch_plan import SECRET_KEYS

    for key in SECRET_KEYS:
        section, name = key.split(".", 1)
        cfg = dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **{name: ""})})
    return cfg


def exchange(group: TPGroup, mine: PoolRank, io_address: str) -> tuple[list[PoolRank], list[str]]:
    """Every rank's pool and gRPC address, in rank order (an all_gather over the group)."""
    out: list = [None] * group.size
    torch.distributed.all_gather_object(out, (mine, io_address), group=group.cpu_pg)
    return [r for r, _ in out], [a for _, a in out]


def agree_pages(group: TPGroup | None, num_pages: int) -> int:
    """The pool size every rank uses: the fewest pages any rank's memory holds."""
    if group is None or group.size == 1:
        return num_pages
    out: list = [None] * group.size
    torch.distributed.all_gather_object(out, num_pages, group=group.cpu_pg)
    return min(out)


def describe(ranks: Sequence[PoolRank]) -> str:
    return ", ".join(f"rank {i}: heads {r.heads.start}..{r.heads.stop - 1} at {r.segment}" for i, r in enumerate(ranks))


class TPState:
    """Rank 0's hold on its group: the follower processes, the group, the step channel and the
    followers' I/O stubs. A broken group (a rank died or hung) takes this process down at once:
    nothing it computes without its followers is right, and its restart restarts them all."""

    def __init__(self, procs: FollowerProcesses, group: TPGroup, timeout_s: float,
                 thread_init: Callable[[], None] | None = None):
        from pdorch.worker.tp_steps import StepChannel

        self.procs, self.group, self.size = procs, group, group.size
        self.channel = StepChannel(group, self._broken, heartbeat_s=timeout_s / 4, dead_ranks=procs.dead,
                                   thread_init=thread_init)
        self.followers: Followers | None = None  # set by connect()

    def connect(self, mine: PoolRank, model: DecoderModel, pool: KVPool, attention: str
                ) -> tuple[list[PoolRank], GroupRunner]:
        """(every rank's PoolRank, rank 0's GroupRunner), once this rank's pool and transfer are up."""
        from pdorch.worker.tp_io import Followers
        from pdorch.worker.tp_steps import GroupRunner

        ranks, addresses = exchange(self.group, mine, "")
        self.followers = Followers(addresses[1:])
        log.info("TP group of %d ranks: %s", self.size, describe(ranks))
        return ranks, GroupRunner(model, model.local_arch, pool, attention, self.channel)

    def _broken(self, error: BaseException) -> None:
        log.critical("TP group broken (%s: %s; follower ranks exited: %s): this worker exits so that its "
                     "group restarts", type(error).__name__, error, self.procs.dead() or "none")
        logging.shutdown()
        self.procs.kill()
        os._exit(70)

    def close(self) -> None:
        self.channel.stop(STOP_WAIT_S)
        self.procs.wait(STOP_WAIT_S)
        if self.followers is not None:
            self.followers.close()
