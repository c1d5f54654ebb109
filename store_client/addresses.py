"""The store's two addresses in the forms Mooncake deployments use.

    store.master_address   host:port                          one mooncake_master (its RPC port)
                           etcd://h1:p1;etcd://h2:p2 (or      masters in HA mode: the client finds the
                           etcd://h1:p1;h2:p2)                leader through etcd
    store.metadata_server  http://host:port/path              an HTTP metadata server (the master's own)
                           etcd://h1:p1[;etcd://h2:p2 ...]    transfer-engine metadata in etcd
                           P2PHANDSHAKE                       none: the engines exchange it themselves

`MasterAddress.mooncake` is the string Mooncake's client takes for the first; `metadata_for_mooncake`
the one its transfer engine takes for the second (docs/workers.md, "Master HA": what was measured).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ETCD = "etcd://"
_HOST_PORT = re.compile(r"(\[[0-9a-fA-F:]+\]|[^\s:/;\[\]]+):(\d{1,5})")
MASTER_FORMS = "host:port (one master) or etcd://host:port;etcd://host:port;... (masters in HA mode behind etcd)"
METADATA_FORMS = ("http://host:port/path (an HTTP metadata server), etcd://host:port;etcd://host:port;... (etcd) "
                  "or P2PHANDSHAKE (no metadata server)")


@dataclass(frozen=True)
class MasterAddress:
    endpoints: tuple[tuple[str, int], ...]  # the master's RPC address, or the etcd endpoints (ha)
    ha: bool

    @property
    def mooncake(self) -> str:
        """As Mooncake's client takes it: host:port, or etcd:// and the endpoints joined by ';'."""
        joined = ";".join(f"{h}:{p}" for h, p in self.endpoints)
        return ETCD + joined if self.ha else joined

    @property
    def etcd_endpoints(self) -> tuple[str, ...]:
        return tuple(f"{h}:{p}" for h, p in self.endpoints) if self.ha else ()


def etcd_endpoints(value: str, key: str) -> tuple[tuple[str, int], ...]:
    """The (host, port) endpoints of an etcd:// address."""
    return _endpoints(value, key, METADATA_FORMS if "metadata" in key else MASTER_FORMS)


def _endpoints(value: str, key: str, forms: str) -> tuple[tuple[str, int], ...]:
    """`etcd://h:p;etcd://h:p` (each `etcd://` after the first optional) -> ((h, p), ...)."""
    out = []
    for i, part in enumerate(value[len(ETCD):].split(";")):
        part = part.strip()
        if i and part.startswith(ETCD):
            part = part[len(ETCD):]
        m = _HOST_PORT.fullmatch(part)
        if not m or not 1 <= int(m.group(2)) <= 65535:
            raise ValueError(f"{key}: {part!r} in {value!r} is not a host:port etcd endpoint; expected {forms}")
        out.append((m.group(1), int(m.group(2))))
    return tuple(out)


def parse_master_address(value: str, key: str = "store.master_address") -> MasterAddress:
    if value.startswith(ETCD):
        return MasterAddress(_endpoints(value, key, MASTER_FORMS), ha=True)
    m = _HOST_PORT.fullmatch(value)
    if not m or not 1 <= int(m.group(2)) <= 65535:
        raise ValueError(f"{key}: expected {MASTER_FORMS}, got {value!r}")
    return MasterAddress(((m.group(1), int(m.group(2))),), ha=False)


def check_metadata_server(value: str, key: str = "store.metadata_server") -> None:
    if value.startswith(ETCD):
        _endpoints(value, key, METADATA_FORMS)
    elif value != "P2PHANDSHAKE" and not re.fullmatch(r"https?://[^\s/]+(/\S*)?", value):
        raise ValueError(f"{key}: expected {METADATA_FORMS}, got {value!r}")


def metadata_for_mooncake(value: str) -> str:
    """As the transfer engine takes it: an HTTP URL as it is, etcd endpoints as etcd://h1:p1;h2:p2."""
    if not value.startswith(ETCD):
        return value
    return ETCD + ";".join(f"{h}:{p}" for h, p in _endpoints(value, "store.metadata_server", METADATA_FORMS))
