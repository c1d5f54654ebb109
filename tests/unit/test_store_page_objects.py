"""A page kept as one store object per KV-head group: written by a pool of one TP size, read into
pools of others (their own heads, in place); pages counted whole; removal takes every group.

The Mooncake client here is a small in-memory fake that really copies bytes to and from the pool's
addresses (the real store's behaviour with these objects is covered by the integration tests)."""

from __future__ import annotations

import ctypes

import pytest
import torch
from prometheus_client import CollectorRegistry

from engine.arch import ModelArch
from engine.kv_pool import KVPool
from pdorch.config import StoreConfig
from store_client.metrics import StoreMetrics
from store_client.page_objects import MAX_GROUPS, PageObjects, head_groups
from store_client.store import KVStore

ABSENT, LEASED = -704, -706


class MemoryClient:
    """batch_is_exist / batch_put_from / batch_get_into / batch_remove over a dict of bytes."""

    def __init__(self):
        self.objects: dict[str, bytes] = {}
        self.leased: set[str] = set()
        self.calls: list[tuple[str, list[str]]] = []

    def batch_is_exist(self, keys):
        self.calls.append(("exist", list(keys)))
        return [1 if k in self.objects else 0 for k in keys]

    def batch_put_from(self, keys, addrs, sizes):
        self.calls.append(("put", list(keys)))
        for k, a, n in zip(keys, addrs, sizes):
            self.objects[k] = ctypes.string_at(a, n)
        return [0] * len(keys)

    def batch_get_into(self, keys, addrs, sizes):
        self.calls.append(("get", list(keys)))
        out = []
        for k, a, n in zip(keys, addrs, sizes):
            data = self.objects.get(k)
            if data is None:
                out.append(ABSENT)
            elif len(data) != n:
                out.append(len(data))
            else:
                ctypes.memmove(a, data, n)
                out.append(n)
        return out

    def batch_remove(self, keys):
        self.calls.append(("remove", list(keys)))
        out = []
        for k in keys:
            out.append(LEASED if k in self.leased else 0 if self.objects.pop(k, None) is not None else ABSENT)
        return out


def arch(kv_heads: int) -> ModelArch:
    return ModelArch(family="llama", vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=2,
                     num_heads=8, num_kv_heads=kv_heads, head_dim=4, rope_theta=1e4, rms_norm_eps=1e-5,
                     tie_word_embeddings=False, checkpoint_dtype="float32")


def store_over(pool: KVPool, model_kv: int, heads: range, client: MemoryClient) -> KVStore:
    objects = PageObjects.for_heads(model_kv, heads, pool.head_nbytes)
    store = KVStore(StoreConfig(enabled=False), pool.page_nbytes, StoreMetrics(CollectorRegistry()),
                    objects=objects)
    store._connector.client = lambda: client  # connected, without a master
    return store


@pytest.mark.parametrize("kv_heads, groups", [(1, 1), (2, 2), (3, 3), (8, 8), (12, 6), (16, 8), (32, 8)])
def test_groups_per_page_depend_on_the_model_only(kv_heads, groups):
    assert head_groups(kv_heads) == groups <= MAX_GROUPS


def test_a_page_written_at_tp1_is_read_by_each_rank_of_tp2_and_tp4_into_its_own_heads():
    client = MemoryClient()
    whole = KVPool(arch(4), 4, 2)
    whole.tensor.normal_()
    writer = store_over(whole, 4, range(4), client)
    keys = ["fp/a", "fp/b"]
    saved = writer.save(keys, whole.page_addrs([1, 3]))
    assert (saved.pages_written, saved.pages_failed) == (2, 0)
    assert sorted(client.objects) == [f"fp/{p}-g{g}" for p in "ab" for g in range(4)]
    for size in (2, 4):
        for rank in range(size):
            heads = range(rank * 4 // size, (rank + 1) * 4 // size)
            local = KVPool(arch(len(heads)), 3, 2)
            got = store_over(local, 4, heads, client).load(keys, local.page_addrs([2, 0]))
            assert got.pages_loaded == 2 and got.reason == "ok"
            assert torch.equal(local.tensor[2], whole.tensor[1, heads.start:heads.stop])
            assert torch.equal(local.tensor[0], whole.tensor[3, heads.start:heads.stop])


def test_pages_written_by_two_ranks_are_read_whole_at_tp1():
    client = MemoryClient()
    ranks = [KVPool(arch(1), 2, 2) for _ in range(2)]
    for r, pool in enumerate(ranks):
        pool.tensor.normal_()
        assert store_over(pool, 2, range(r, r + 1), client).save(["fp/a"], pool.page_addrs([1])).pages_written == 1
    whole = KVPool(arch(2), 2, 2)
    store = store_over(whole, 2, range(2), client)
    assert store.present(["fp/a", "fp/b"]) == (True, False)
    assert store.load(["fp/a"], whole.page_addrs([0])).pages_loaded == 1
    assert torch.equal(whole.tensor[0], torch.cat([ranks[0].tensor[1], ranks[1].tensor[1]]))
    # the same page again: every object is there, nothing is written
    again = store.save(["fp/a"], whole.page_addrs([0]))
    assert (again.pages_written, again.pages_skipped) == (0, 1) and client.calls[-1][0] == "exist"


def test_a_page_missing_one_group_is_not_read_and_not_present():
    client = MemoryClient()
    pool = KVPool(arch(2), 2, 2)
    store = store_over(pool, 2, range(2), client)
    store.save(["fp/a", "fp/b"], pool.page_addrs([0, 1]))
    del client.objects["fp/a-g1"]
    assert store.present(["fp/a", "fp/b"]) == (False, True)
    got = store.load(["fp/a", "fp/b"], pool.page_addrs([0, 1]))
    assert got.page_ok == (False, True) and got.reason == "absent"
    # a rank holding only group 0 still reads page a
    half = KVPool(arch(1), 1, 2)
    assert store_over(half, 2, range(1), client).load(["fp/a"], half.page_addrs([0])).pages_loaded == 1


def test_removal_takes_every_group_of_a_page():
    client = MemoryClient()
    pool = KVPool(arch(2), 3, 2)
    half = store_over(KVPool(arch(1), 1, 2), 2, range(1, 2), client)  # a rank holding group 1 only
    store_over(pool, 2, range(2), client).save(["fp/a", "fp/b", "fp/c"], pool.page_addrs([0, 1, 2]))
    client.leased.add("fp/b-g1")
    del client.objects["fp/c-g0"]
    assert half.remove_many(["fp/a", "fp/b", "fp/c", "fp/d"]) == [0, LEASED, 0, ABSENT]
    assert sorted(client.objects) == ["fp/b-g1"]


def test_heads_that_are_not_whole_groups_are_refused_by_name():
    with pytest.raises(ValueError, match="not whole store groups of 2 heads.*num_key_value_heads=12"):
        PageObjects.for_heads(12, range(3, 6), 64)  # TP 4 of 12 KV heads: 3 heads, groups of 2
    with pytest.raises(ValueError, match="page_nbytes"):
        KVStore(StoreConfig(enabled=False), 100, StoreMetrics(CollectorRegistry()),
                objects=PageObjects(2, range(2), 64))
