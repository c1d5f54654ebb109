"""What a store operation answers (store_client/store.py): per-page results, and the reason a page
was not loaded or written, from Mooncake's negative codes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

OK = "ok"
ABSENT = "absent"
TRANSFER_FAILED = "transfer_failed"
RPC_FAILED = "rpc_failed"
TIMEOUT = "timeout"
DISABLED = "disabled"
NO_SPACE = "no_space"
# Traces only (metrics count it as transfer_failed): an object of another size under the key.
SIZE_MISMATCH = "size_mismatch"

_NOT_FOUND = -704
_EXISTS = -705
_LEASED = -706
_NO_SPACE = -200
_RPC_FAILED = -900


@dataclass(frozen=True)
class LoadResult:
    pages_loaded: int  # pages whose bytes are now in the pool (anywhere in the request)
    reason: str  # OK when all were loaded, else why the first missing page was not
    page_ok: tuple[bool, ...] = ()  # per page: loaded
    page_ssd: tuple[bool, ...] = ()  # per page: loaded from the SSD tier (replica_tier.py); () = none
    miss_reasons: tuple[str, ...] = ()  # per page NOT loaded, in order, why (SIZE_MISMATCH apart)


@dataclass(frozen=True)
class SaveResult:
    pages_written: int
    pages_skipped: int  # already in the store (not rewritten)
    pages_failed: int
    reason: str  # OK, or the reason of the first failure
    page_ok: tuple[bool, ...] = ()  # per page: the store holds it now (written or skipped)


def classify(code: int, elapsed_s: float, deadline_s: float) -> str:
    """Reason for one negative Mooncake result."""
    if code == _NOT_FOUND:
        return ABSENT
    if elapsed_s >= deadline_s:
        return TIMEOUT
    if code == _RPC_FAILED:
        return RPC_FAILED
    if code == _NO_SPACE:
        return NO_SPACE
    return TRANSFER_FAILED


def check_pairs(keys: Sequence[str], addrs: Sequence[int]) -> None:
    """One address per key, or a ValueError naming both counts."""
    if len(keys) != len(addrs):
        raise ValueError(f"got {len(keys)} keys but {len(addrs)} page addresses")

