"""Which mooncake_master leads, in HA mode: Mooncake's master view in etcd.

The leader holds `mooncake-store/<cluster id>/master_view` under an etcd lease (5 s), its value the
leader's RPC address `host:port`; a standby takes it over when the lease runs out (measured:
docs/workers.md, "Master HA"). The evictor reads the leader's metrics through it, `pdorch status`
shows it.

A leader is one term, not one address: a master killed and restarted at the same host:port (fixed
ports in `pdorch serve`, a pod that keeps its IP) that wins the election again holds only what its
oplog replay gave it (nothing without the oplog), so it is a switch like any other. Each win writes the key anew under a new lease, so `Leader` carries the
key's etcd create revision and lease id beside the address; two terms of one address differ in them.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported lazily at run time (term()): only HA deployments pay for it
    import etcd3

log = logging.getLogger(__name__)

DEFAULT_CLUSTER_ID = "mooncake_cluster"  # mooncake_master --cluster_id's default


def view_key(cluster_id: str = DEFAULT_CLUSTER_ID) -> str:
    return f"mooncake-store/{cluster_id}/master_view"


@dataclass(frozen=True)
class Leader:
    """One leader's term: its address and the etcd identity of the key it won (equal only within
    one term)."""

    address: str
    create_revision: int
    lease_id: int


class MasterView:
    def __init__(self, etcd_endpoints: tuple[str, ...], cluster_id: str = DEFAULT_CLUSTER_ID, timeout_s: float = 1.0):
        self.endpoints, self.key, self.timeout_s = tuple(etcd_endpoints), view_key(cluster_id), timeout_s
        self._clients: dict[str, etcd3.Etcd3Client] = {}

    def leader(self) -> str | None:
        """The leading master's RPC address, None when none leads or no etcd endpoint answers."""
        term = self.term()
        return None if term is None else term.address

    def term(self) -> Leader | None:
        """The leading master's term (address, create revision, lease), None when none leads or no
        etcd endpoint answers."""
        import etcd3  # NOTE: lazy: only HA deployments pay for the import

        for endpoint in self.endpoints:
            host, _, port = endpoint.rpartition(":")
            try:
                client = self._clients.get(endpoint)
                if client is None:
                    client = self._clients[endpoint] = etcd3.client(host=host.strip("[]"), port=int(port),
                                                                    timeout=self.timeout_s)
                value, meta = client.get(self.key)
                if value is None:
                    return None
                return Leader(value.decode(), int(meta.create_revision), int(meta.lease_id))
            except Exception as e:  # noqa: BLE001 - etcd3 raises its own and grpc's errors: try the next endpoint
                log.debug("master view from etcd %s failed: %s", endpoint, e)
                # NOTE: a fresh channel next time: grpc's own reconnect backs off for seconds after a restart
                self._clients.pop(endpoint, None)
        return None


@functools.lru_cache(maxsize=8)
def master_view(etcd_endpoints: tuple[str, ...], cluster_id: str = DEFAULT_CLUSTER_ID) -> MasterView:
    """One MasterView (its etcd connections) per process and etcd cluster."""
    return MasterView(etcd_endpoints, cluster_id)
