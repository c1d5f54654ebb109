"""The real local stack with a fleet that changes size: etcd discovery, a mooncake_master, a store
peer that holds the store's memory, prefill and decode workers run by a LocalFleet, and the router
in this process. Shared by bench/scale_up_hits and its test, bench/scale_up_hits/test_stack.py.

Every worker is a pure store client (store.global_segment_size_mb 0): Mooncake may place a page in
its writer's own segment, and a worker's segment would come and go with it; the peer's stays.
Decode serves no prompt itself (decode.prefix_cache off, max_local_prefill_tokens 0): every prompt
is prefilled on a prefill worker chosen by the router's policy, so the hits measured are its choices.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path
from typing import Self

import httpx

from engine.tokenizer import Tokenizer
from pdorch.config import Config, DiscoveryConfig
from pdorch.config_loader import dump_config
from pdorch.local_fleet import LocalFleet
from pdorch.local_stack.processes import free_port, stop_process
from pdorch.local_stack.router import RouterThread, start_etcd
from pdorch.local_stack.store import Peer
from pdorch.local_stack.workers import make_config
from store_client.master import MasterProcess

START_TIMEOUT_S = 180.0


class FleetStack:
    """`with FleetStack(model_dir, prefill, decode) as s:` the stack up, the fleet at that size and
    routable; `s.scale(p, d)` grows or shrinks it and waits until the router routes to exactly that."""

    def __init__(self, model_dir: Path, prefill: int, decode: int, log_dir: Path | None = None,
                 router_keys: dict | None = None, say=print):
        self.model_dir, self.size, self.say = Path(model_dir), (prefill, decode), say
        self.router_keys = router_keys or {}
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="pdorch-scale-up-"))
        self.fleet: LocalFleet | None = None
        self.router: RouterThread | None = None
        self._etcd = self._master = self._holder = None

    def __enter__(self) -> Self:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self) -> None:
        tmp = self.log_dir
        tmp.mkdir(parents=True, exist_ok=True)
        self._etcd = start_etcd(tmp)
        self._master = MasterProcess(log_dir=str(tmp)).start()
        m = self._master
        self._holder = Peer("store-writer", {"master_address": m.master_address, "metadata_server": m.metadata_url,
                                             "segment_mb": 256, "seed": 0, "num_pages": 1, "page_nbytes": 4096,
                                             "keys": []}, str(tmp))
        if not self._holder.ready["enabled"]:
            raise RuntimeError(f"the store peer did not join the store; logs in {tmp}")
        cfg = make_config(tmp, self.model_dir, m, decode={"prefix_cache": False, "max_local_prefill_tokens": 0})
        cfg = dataclasses.replace(
            cfg, store=dataclasses.replace(cfg.store, global_segment_size_mb=0),
            discovery=DiscoveryConfig(mode="etcd", etcd_endpoints=(self._etcd.endpoint,), lease_ttl_s=5),
            router=dataclasses.replace(cfg.router, port=free_port(), health_check_interval_s=0.3, **self.router_keys))
        self.cfg: Config = cfg
        path = tmp / "fleet.yaml"
        dump_config(cfg, path)
        self.fleet = LocalFleet(cfg, ("--config", str(path)), tmp, torch_threads=1, say=self.say)
        self.fleet.apply({"prefill": self.size[0], "decode": self.size[1]})
        self.fleet.converge(START_TIMEOUT_S)
        self.router = RouterThread(cfg, Tokenizer.from_dir(self.model_dir), self.model_dir).start()
        self.wait_routable(*self.size)

    def scale(self, prefill: int, decode: int) -> float:
        """Grow or shrink the fleet and wait until the router routes to exactly that; the seconds it took."""
        t0 = time.monotonic()
        self.fleet.apply({"prefill": prefill, "decode": decode})
        self.fleet.converge(START_TIMEOUT_S)
        self.wait_routable(prefill, decode)
        return time.monotonic() - t0

    def workers(self) -> list[dict]:
        """The router's /workers list."""
        return httpx.get(self.router.url + "/workers", timeout=30).json()["workers"]

    def wait_routable(self, prefill: int, decode: int, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            roles = [w["role"] for w in self.workers() if w["healthy"]]
            if (roles.count("prefill"), roles.count("decode")) == (prefill, decode):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"router sees {roles}, want {prefill} prefill + {decode} decode")
            time.sleep(0.2)

    def close(self) -> None:
        if self.router is not None:
            self.router.stop()
        if self.fleet is not None:
            self.fleet.stop(30)
        if self._holder is not None:
            self._holder.stop()
        if self._master is not None:
            self._master.stop()
        if self._etcd is not None:
            stop_process(self._etcd.proc)
