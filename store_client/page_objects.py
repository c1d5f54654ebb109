"""PageObjects: how one page is kept in the store, one object per group of KV heads.

A page of the pool is head-major (engine/kv_pool.py): each KV head is one contiguous span. The store
keeps a page as `groups` objects, group g holding the model's KV heads [g * n, (g + 1) * n) with
n = Hkv / groups. `groups` depends on the model only (never on a worker's TP size), so a page written
by a worker of one TP size is read by a worker of any other: each reads exactly the groups its pool
holds, straight into place (docs/workers.md, "The store layout").

    object key   "{page key}-g{g}"      (the page key itself when groups == 1)
    object size  group_nbytes           (page_nbytes / groups of the whole model's page)

KVStore speaks pages to its callers and objects to Mooncake: `keys` / `addrs` expand a batch of
pages to the objects this worker holds, `fold` reduces per-object answers to one per page (a page
is read, present or written only when every object it needs is).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

# At most this many objects per page: with Hkv <= 8 (every Llama / Qwen 2-3 size) one object per KV
# head, so every TP size (1, 2, 4, 8, replicated heads included) reads exactly its heads; smaller
# objects cost little (bench/store_io/run.py --head-groups-only: 0.69x load bandwidth at 8, 0.86x at 4).
MAX_GROUPS = 8


def head_groups(num_kv_heads: int) -> int:
    """Objects per page for a model with `num_kv_heads` KV heads: the largest divisor <= MAX_GROUPS."""
    if num_kv_heads < 1:
        raise ValueError(f"num_kv_heads must be >= 1, got {num_kv_heads}")
    return max(g for g in range(1, min(num_kv_heads, MAX_GROUPS) + 1) if num_kv_heads % g == 0)


@dataclass(frozen=True)
class PageObjects:
    groups: int          # objects per page in the store (the same for every worker of the model)
    held: range          # the groups this worker's pool holds, in the order of its page's heads
    group_nbytes: int    # bytes of one object

    def __post_init__(self):
        if self.groups < 1 or self.group_nbytes < 1 or not self.held or self.held.step != 1 \
                or self.held.start < 0 or self.held.stop > self.groups:
            raise ValueError(f"bad page objects: groups={self.groups}, held={self.held}, "
                             f"group_nbytes={self.group_nbytes}")

    @classmethod
    def whole_page(cls, page_nbytes: int) -> PageObjects:
        """One object per page (a store used without a model: tests, benchmarks)."""
        return cls(1, range(1), page_nbytes)

    @classmethod
    def for_heads(cls, model_kv_heads: int, pool_heads: range, head_nbytes: int) -> PageObjects:
        """The objects of a pool holding the model's KV heads `pool_heads` (all of them at TP 1).
        ValueError when those heads are not whole groups (a layout this worker cannot read)."""
        groups = head_groups(model_kv_heads)
        per = model_kv_heads // groups
        if pool_heads.start % per or len(pool_heads) % per:
            raise ValueError(f"the pool's KV heads {pool_heads.start}..{pool_heads.stop - 1} are not whole store "
                             f"groups of {per} heads (num_key_value_heads={model_kv_heads}, {groups} groups): "
                             "choose a tp_size whose KV heads per rank is a multiple of the group")
        return cls(groups, range(pool_heads.start // per, pool_heads.stop // per), per * head_nbytes)

    @property
    def page_nbytes(self) -> int:
        """Bytes of the pool's page these objects fill."""
        return len(self.held) * self.group_nbytes

    def object_key(self, page_key: str, group: int) -> str:
        return page_key if self.groups == 1 else f"{page_key}-g{group}"

    def page_key(self, object_key: str) -> str:
        return object_key if self.groups == 1 else object_key.rsplit("-g", 1)[0]

    def keys(self, page_keys: Sequence[str]) -> list[str]:
        """The held objects of each page, page after page."""
        return [self.object_key(k, g) for k in page_keys for g in self.held]

    def all_keys(self, page_keys: Sequence[str]) -> list[str]:
        """Every object of each page (removal: an evicted page leaves no group behind)."""
        return [self.object_key(k, g) for k in page_keys for g in range(self.groups)]

    def addrs(self, page_addrs: Sequence[int]) -> list[int]:
        """Where each held object lives in the pool: its group's span of the page."""
        return [a + i * self.group_nbytes for a in page_addrs for i in range(len(self.held))]

    @staticmethod
    def fold(codes: Sequence[int], per_page: int, worst: Callable[[Sequence[int]], int]) -> list[int]:
        """Per-object codes -> one per page: `worst` of each page's `per_page` codes."""
        return [worst(codes[i:i + per_page]) for i in range(0, len(codes), per_page)]
