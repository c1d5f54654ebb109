"""`/flush_cache?store=true` clears a real Mooncake store (admin only) and flushes every worker's L1."""

from __future__ import annotations

import dataclasses

import httpx

from pdorch.config import StoreConfig
from pdorch.local_stack.router import router_config
from store_client.master import MasterProcess


def test_flush_cache_with_store_removes_every_object(tmp_path, standins, make_router):
    from mooncake.store import MooncakeDistributedStore

    master = MasterProcess(log_dir=str(tmp_path)).start()
    store = MooncakeDistributedStore()
    try:
        assert store.setup("127.0.0.1", master.metadata_url, 32 << 20, 16 << 20, "tcp", "",
                           master.master_address) == 0
        for i in range(3):
            assert store.put(f"fp/page-{i}", b"x" * 4096) == 0
        assert [store.is_exist(f"fp/page-{i}") for i in range(3)] == [1, 1, 1]

        p, d = standins("prefill"), standins("decode")
        base = router_config([p.address], [d.address], policy="round_robin", admin_key="sk-admin")
        cfg = dataclasses.replace(base, store=StoreConfig(enabled=True, master_address=master.master_address,
                                                          metadata_server=master.metadata_url))
        r = make_router([], [], cfg=cfg)
        c = httpx.Client(base_url=r.url, timeout=90)
        assert c.post("/flush_cache?store=true").status_code == 401  # admin only
        resp = c.post("/flush_cache?store=true", headers={"Authorization": "Bearer sk-admin"})
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert body["store"]["removed"] == 3
        assert p.behavior.flushes == 1 and d.behavior.flushes == 1
        assert [store.is_exist(f"fp/page-{i}") for i in range(3)] == [0, 0, 0]
    finally:
        store.close()
        master.stop()


def test_flush_cache_store_without_a_store_is_a_clear_501(standins, make_router):
    p, d = standins("prefill"), standins("decode")
    base = router_config([p.address], [d.address], policy="round_robin")
    r = make_router([], [], cfg=dataclasses.replace(base, store=StoreConfig(enabled=False)))
    resp = httpx.post(r.url + "/flush_cache?store=true", timeout=30)
    assert resp.status_code == 501 and "store.enabled is false" in resp.json()["error"]["message"]
