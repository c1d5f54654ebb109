"""Which store tier a read will come from: Mooncake DRAM or its SSD offload files.

Mooncake's batch_get_into says only how many bytes it read, not from where. With the SSD tier on,
KVStore asks the master for each key's replicas (one batch_get_replica_desc RPC, about 2 ms for 96
keys here, on its own thread while the read runs: store.py says why) and counts a page as an SSD
read when its key has a complete disk replica and no complete memory replica: Mooncake reads a memory replica when there is one. The answer is the
master's at lookup time, within milliseconds of the read's start; an eviction in between is
counted as DRAM although it came from disk.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

log = logging.getLogger(__name__)


def _complete(replica) -> bool:
    return getattr(replica.status, "name", str(replica.status)).endswith("COMPLETE")


def on_disk_only(replicas) -> bool:
    """True when the only complete replicas of a key are on disk (an SSD read)."""
    done = [r for r in replicas or () if _complete(r)]
    if any(r.is_memory_replica() for r in done):
        return False
    return any(r.is_disk_replica() or r.is_local_disk_replica() for r in done)


def disk_only_keys(client, keys: Sequence[str]) -> list[bool]:
    """Per key: read from the SSD tier (False for all when the lookup fails: a read is never held up)."""
    try:
        descs = client.batch_get_replica_desc(list(keys))
    except Exception as e:  # noqa: BLE001 - attribution only; the read itself goes ahead
        log.warning("batch_get_replica_desc raised: %s", e)
        return [False] * len(keys)
    return [on_disk_only(descs.get(k)) for k in keys]
