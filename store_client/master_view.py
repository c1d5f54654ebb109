"""Which mooncake_master leads, in HA mode: Mooncake's master view in etcd.

The leader holds `mooncake-store/<cluster id>/master_view` under an etcd lease (5 s), its value the
leader's RPC address `host:port`; a standby takes it over when the lease runs out (measured:
docs/workers.md, "Master HA"). The evictor reads the leader's metrics through it, `pdorch status`
shows it.
"""

from __future__ import annotations

import functools
import logging

log = logging.getLogger(__name__)

DEFAULT_CLUSTER_ID = "mooncake_cluster"  # mooncake_master --cluster_id's default


def view_key(cluster_id: str = DEFAULT_CLUSTER_ID) -> str:
    return f"mooncake-store/{cluster_id}/master_view"


class MasterView:
    def __init__(self, etcd_endpoints: tuple[str, ...], cluster_id: str = DEFAULT_CLUSTER_ID, timeout_s: float = 1.0):
        self.endpoints, self.key, self.timeout_s = tuple(etcd_endpoints), view_key(cluster_id), timeout_s
        self._clients: dict[str, object] = {}

    def leader(self) -> str | None:
        """The leading master's RPC address, None when none leads or no etcd endpoint answers."""
        import etcd3  # NOTE: lazy: only HA deployments pay for the import

        for endpoint in self.endpoints:
            host, _, port = endpoint.rpartition(":")
            try:
                client = self._clients.get(endpoint)
                if client is None:
                    client = self._clients[endpoint] = etcd3.client(host=host.strip("[]"), port=int(port),
                                                                    timeout=self.timeout_s)
                value, _ = client.get(self.key)
                return None if value is None else value.decode()
            except Exception as e:  # noqa: BLE001 - etcd3 raises its own and grpc's errors: try the next endpoint
                log.debug("master view from etcd %s failed: %s", endpoint, e)
        return None


@functools.lru_cache(maxsize=8)
def master_view(etcd_endpoints: tuple[str, ...], cluster_id: str = DEFAULT_CLUSTER_ID) -> MasterView:
    """One MasterView (its etcd connections) per process and etcd cluster."""
    return MasterView(etcd_endpoints, cluster_id)
