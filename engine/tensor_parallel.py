"""Tensor parallelism: which slice of the model a rank holds (TPShard) and the collectives that join
the slices (TPGroup), sharded as SGLang and vLLM shard Llama / Qwen2.

    qkv, gate_up   column-parallel: rank r holds its heads' / its ffn columns' rows; no communication
    o, down        row-parallel: rank r holds the matching input columns; the partial sums are
                   all-reduced, then the (replicated) bias is added once
    embed          vocab-parallel: ids outside the rank's rows give zero rows, then all-reduce
    lm_head        vocab-parallel: logits of the rank's rows, gathered to rank 0 (the one that samples)
    norms          replicated

Two process groups: `pg` (NCCL on CUDA, gloo on CPU) for the model's tensors, and `cpu_pg` (gloo; the
same group on CPU) for what the host sends: each step's batch from rank 0 (pdorch/worker/tp_steps.py)
and start-up exchanges. So a step's metadata never takes a device copy or a NCCL call.

The vocabulary is padded to a multiple of tp_size and split into equal contiguous ranges; the
padded rows (last rank only) are zero and their logits are dropped after the gather.

The head-to-rank map (Hq query heads, Hkv KV heads, tp_size = s; query head j reads KV head j // G,
G = Hq / Hkv):

    query heads of rank r    [r * Hq/s, (r+1) * Hq/s)                      s must divide Hq
    KV heads, s <= Hkv       [r * Hkv/s, (r+1) * Hkv/s)                    s must divide Hkv
    KV heads, s > Hkv        the one head r // (s/Hkv), REPLICATED on the  Hkv must divide s
                             s/Hkv ranks that share it (as vLLM does)

e.g. Hq=4, Hkv=2, s=4: ranks 0,1 hold KV head 0 and ranks 2,3 KV head 1; rank r holds query head r.
Each rank's KV pool holds its KV heads only (`local_arch`), so `kv_heads()` is also the map from a
pool's heads to the model's, the one a KV transfer between workers of other TP sizes needs.

Size 1 is the plain model: `local_arch` returns the arch itself and TPGroup needs no torch.distributed.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.arch import ModelArch


@dataclass(frozen=True)
class TPShard:
    rank: int = 0
    size: int = 1

    def __post_init__(self):
        if not 0 <= self.rank < self.size:
            raise ValueError(f"tp rank {self.rank} outside 0..{self.size - 1} (tp_size={self.size})")

    def check(self, arch: ModelArch) -> None:
        """ValueError naming tp_size and the model's sizes when this split is not supported."""
        s, hq, hkv, f = self.size, arch.num_heads, arch.num_kv_heads, arch.intermediate_size
        what = f"num_attention_heads={hq}, num_key_value_heads={hkv}, intermediate_size={f}"
        if hq % s:
            raise ValueError(f"tp_size={s} must divide num_attention_heads ({what})")
        if (s <= hkv and hkv % s) or (s > hkv and s % hkv):
            raise ValueError(f"tp_size={s} must divide num_key_value_heads or be a multiple of it ({what})")
        if f % s:
            raise ValueError(f"tp_size={s} must divide intermediate_size ({what})")

    def replicated_kv(self, arch: ModelArch) -> bool:
        """More ranks than KV heads: each KV head lives on size / Hkv ranks."""
        return self.size > arch.num_kv_heads

    def q_heads(self, arch: ModelArch) -> range:
        n = arch.num_heads // self.size
        return range(self.rank * n, (self.rank + 1) * n)

    def kv_heads(self, arch: ModelArch) -> range:
        """The model's KV heads this rank holds, in the order of its pool's heads."""
        self.check(arch)
        if self.replicated_kv(arch):
            head = self.rank // (self.size // arch.num_kv_heads)
            heads = range(head, head + 1)
        else:
            n = arch.num_kv_heads // self.size
            heads = range(self.rank * n, (self.rank + 1) * n)
        group = arch.num_heads // arch.num_kv_heads
        q = self.q_heads(arch)
        # NOTE: GQA: the rank's query heads must read only its KV heads (true whenever check() passes).
        assert heads.start == q.start // group and heads.stop == (q.stop - 1) // group + 1, (q, heads)
        return heads

    def ffn_cols(self, arch: ModelArch) -> range:
        """This rank's columns of the MLP's intermediate dimension."""
        n = arch.intermediate_size // self.size
        return range(self.rank * n, (self.rank + 1) * n)

    def vocab_per_rank(self, arch: ModelArch) -> int:
        """Rows of embed / lm_head on each rank: the vocabulary padded to a multiple of size, split."""
        return -(-arch.vocab_size // self.size)

    def vocab_rows(self, arch: ModelArch) -> range:
        """The real vocabulary rows this rank holds (the last rank's range may be short: padding)."""
        n = self.vocab_per_rank(arch)
        return range(min(self.rank * n, arch.vocab_size), min((self.rank + 1) * n, arch.vocab_size))

    def local_arch(self, arch: ModelArch) -> ModelArch:
        """The arch as this rank sees it (its heads and ffn columns): what its KVPool and attention use."""
        self.check(arch)
        if self.size == 1:
            return arch
        return dataclasses.replace(arch, num_heads=len(self.q_heads(arch)), num_kv_heads=len(self.kv_heads(arch)),
                                   intermediate_size=len(self.ffn_cols(arch)))


NO_TP = TPShard(0, 1)  # the whole model in one process (the default everywhere)


class TPGroup:
    """The collectives of one TP group; size 1 is a no-op group (no torch.distributed needed)."""

    def __init__(self, rank: int = 0, size: int = 1, pg=None, cpu_pg=None):
        if size > 1 and pg is None:
            raise ValueError(f"tp_size={size} needs a torch.distributed process group (init_tp_group)")
        self.rank, self.size, self.pg = rank, size, pg
        self.cpu_pg = cpu_pg if cpu_pg is not None else pg  # gloo: host data (a CPU group is both)

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum over the ranks, in place; returns t."""
        if self.size > 1:
            torch.distributed.all_reduce(t, group=self.pg)
        return t

    def gather_last_dim(self, t: torch.Tensor) -> torch.Tensor:
        """[..., n] on each rank -> [..., size * n] in rank order ON RANK 0 (the vocab-parallel logits:
        only rank 0 samples); the other ranks get their own `t` back."""
        if self.size == 1:
            return t
        t = t.contiguous()
        parts = [torch.empty_like(t) for _ in range(self.size)] if self.rank == 0 else None
        torch.distributed.gather(t, parts, dst=0, group=self.pg)
        return torch.cat(parts, dim=-1) if parts is not None else t

    def close(self) -> None:
        if self.pg is not None:
            if self.cpu_pg is not self.pg:
                torch.distributed.destroy_process_group(self.cpu_pg)
            torch.distributed.destroy_process_group(self.pg)
            self.pg = self.cpu_pg = None


# A rank's start (importing torch, reading its config) may take far longer than a collective is allowed to
# (model.tp_timeout_s, seconds at the least) on a loaded machine: the rendezvous has this bound of its own.
JOIN_TIMEOUT_S = 120.0
_JOIN_POLL_S = 0.5  # how often a rank waiting for the others runs its `check`


def init_tp_group(rank: int, size: int, init_method: str, backend: str = "gloo", timeout_s: float = 60.0,
                  join_timeout_s: float = JOIN_TIMEOUT_S, check: Callable[[], None] | None = None) -> TPGroup:
    """Join the group of `size` ranks at `init_method` (tcp://host:port or file://path); gloo on CPU,
    nccl on CUDA. The ranks first meet in the store, each waiting up to max(join_timeout_s, timeout_s) for
    the others and calling `check` (which raises to give up: rank 0's "a follower has exited") every
    half second meanwhile; then every collective fails after timeout_s instead of hanging."""
    if size == 1:
        return TPGroup()
    store = _meet(rank, size, init_method, max(join_timeout_s, timeout_s), check)
    timeout = datetime.timedelta(seconds=timeout_s)
    store.set_timeout(timeout)
    torch.distributed.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=timeout)
    world = torch.distributed.group.WORLD
    # NOTE: every rank creates the CPU group at the same point (new_group is itself a collective)
    cpu = world if backend == "gloo" else torch.distributed.new_group(backend="gloo", timeout=timeout)
    return TPGroup(rank, size, world, cpu)


def _meet(rank: int, size: int, init_method: str, join_timeout_s: float,
          check: Callable[[], None] | None) -> torch.distributed.Store:
    """The group's store, once every rank has reached it (its own key set, all keys seen)."""
    store, _, _ = next(torch.distributed.rendezvous(init_method, rank, size,
                                                    timeout=datetime.timedelta(seconds=join_timeout_s)))
    store.set(f"pdorch/joined/{rank}", "1")
    keys = [f"pdorch/joined/{r}" for r in range(size)]
    deadline = time.monotonic() + join_timeout_s
    while True:
        try:
            store.wait(keys, datetime.timedelta(seconds=_JOIN_POLL_S))
            return store
        except RuntimeError:  # torch.distributed.DistStoreError: not all there yet
            if check is not None:
                check()
            if time.monotonic() > deadline:
                missing = [r for r in range(size) if not store.check([f"pdorch/joined/{r}"])]
                raise TimeoutError(f"tensor-parallel rank {rank}: ranks {missing} did not join within "
                                   f"{join_timeout_s:.0f} s") from None
