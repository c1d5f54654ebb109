"""The etcd `pdorch serve` starts itself when it needs one and none is given.

Who needs etcd locally, and what it is used for:

    --masters N (N >= 2), store.master_address not etcd://   the masters elect their leader and
        replicate their metadata in it: store.master_address and store.metadata_server -> etcd://
    --autoscale, discovery.mode static                       the workers the fleet starts and stops
        register themselves: discovery.mode etcd, discovery.etcd_endpoints -> it

An etcd the config names is used as it is (`pdorch serve` refuses to start when it does not answer:
a master or a router would wait on it until the start-up timeout). The local one is Debian's
`etcd` (package etcd-server), one member on free loopback ports, its data under the log dir; it is
the first child to start and the last to stop. It keeps its revisions for an hour and compacts
the rest (the masters' oplog and the workers' lease renewals would otherwise grow it without end).
"""

from __future__ import annotations

import dataclasses
import shutil

from pdorch.config import Config
from pdorch.launch_plan import ChildSpec, PlanError
from pdorch.ports import free_port

MEMBER_NAME = "pdorch-etcd"
QUOTA_BACKEND_BYTES = 2 * 1024 ** 3  # etcd's own default, explicit: a full etcd refuses writes (alarm NOSPACE)


@dataclasses.dataclass(frozen=True)
class EtcdNeeds:
    """What the local cluster uses a local etcd for (both False: none is started)."""

    masters: bool  # HA masters with no etcd:// master address given
    discovery: bool  # --autoscale with static discovery

    @property
    def any(self) -> bool:
        return self.masters or self.discovery


def etcd_needs(cfg: Config, num_masters: int, autoscale: bool) -> EtcdNeeds:
    from store_client.addresses import parse_master_address

    masters = (num_masters >= 2 and cfg.store.enabled
               and not parse_master_address(cfg.store.master_address).ha)
    return EtcdNeeds(masters=masters, discovery=autoscale and cfg.discovery.mode != "etcd")


@dataclasses.dataclass(frozen=True)
class LocalEtcd:
    client_port: int
    peer_port: int
    data_dir: str
    host: str = "127.0.0.1"

    @classmethod
    def on_free_ports(cls, data_dir: str) -> LocalEtcd:
        return cls(free_port(), free_port(), data_dir)

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    def spec(self, binary: str | None = None) -> ChildSpec:
        """The child `pdorch serve` starts first; PlanError when the binary is not installed."""
        binary = binary or shutil.which("etcd")
        if binary is None:
            raise PlanError("pdorch serve needs etcd here (--masters >= 2 or --autoscale with no etcd given) and "
                            "the `etcd` binary is not on PATH: install Debian's etcd-server, or give one with "
                            "store.master_address=etcd://host:port / discovery.etcd_endpoints")
        client, peer = f"http://{self.host}:{self.client_port}", f"http://{self.host}:{self.peer_port}"
        argv = (binary, "--name", MEMBER_NAME, "--data-dir", self.data_dir,
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"{MEMBER_NAME}={peer}",
                "--auto-compaction-mode", "periodic", "--auto-compaction-retention", "1h",
                "--quota-backend-bytes", str(QUOTA_BACKEND_BYTES))
        return ChildSpec("etcd", "etcd", argv, self.host, (("etcd.client_port", self.client_port),
                                                            ("etcd.peer_port", self.peer_port)))

    def overrides(self, needs: EtcdNeeds) -> tuple[str, ...]:
        """The `--set` flags that point the cluster at this etcd (every child gets them)."""
        address = f"etcd://{self.endpoint}"
        sets: list[str] = []
        if needs.masters:
            sets += [f"store.master_address={address}", f"store.metadata_server={address}"]
        if needs.discovery:
            sets += ["discovery.mode=etcd", f"discovery.etcd_endpoints={self.endpoint}"]
        return tuple(sets)
